"""`copy --fit` / `--budget`: which files a hot copy sized to the fast tier takes.

A fresh draw ranks each class's files by a seeded hash and takes the same largest share
of every class that fits the budget with the margin (selection.fit). The rule, the share
and the budget go into the copy's metadata; a refresh of such a copy keeps exactly the
members it has (those still in SRC), so a job's hot share does not change under it,
until `--redraw` draws again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hotcache.provision.errors import UsageError
from hotcache.provision.hotcopy import manifest
from hotcache.provision.hotcopy.format import MANIFEST, home
from hotcache.provision.hotcopy.selection import Selection, narrow, fit
from hotcache.provision.hotcopy.sizing import Advice, advise, budget_bytes
from hotcache.provision.system.sizes import size

RULE = "fit"
RULE_KEYS = ("rule", "seed", "class_fraction", "stratified_by", "budget", "budget_bytes",
             "budget_from", "margin", "drawn_at_version")


def sized(sel: Selection, dest: Path, old: dict[str, Any] | None, *, fit_: bool,
          budget: str | None, margin: float, seed: int, redraw: bool, explicit: bool,
          note: Callable[[str], object] = print) -> Selection:
    """The selection narrowed to what a sized copy takes; `sel` itself when nothing asks
    for sizing. `old`: the metadata of the copy published at `dest` (None: none).
    `explicit`: the user chose files another way (--fraction, --list)."""
    if budget is not None:
        fit_ = True
    if fit_ and explicit:
        raise UsageError("--fit/--budget choose the files themselves: leave out "
                         "--fraction and --list", hint="--include/--exclude still narrow "
                                                        "what --fit draws from")
    old_rule = ((old or {}).get("selection") or {})
    if old is not None and old_rule.get("rule") == RULE and not redraw and not explicit:
        return _kept(sel, dest, old, old_rule, note)
    if not fit_:
        if redraw:
            raise UsageError("--redraw draws a --fit copy's members again: give --fit or "
                             "--budget too")
        return sel
    reusable = int((old or {}).get("bytes") or 0)
    limit, how = budget_bytes(budget, home(dest), reusable)
    target = int(limit / (1 + margin))
    picked, share = fit(sel, target, seed)
    if not picked.entries:
        raise UsageError(f"--fit: not even one file of each class fits in {size(target)} "
                         f"({how}: {size(limit)}, less the {margin:.0%} margin)",
                         hint="free space on the fast tier, or give a larger --budget")
    picked.rule = {"rule": RULE, "seed": seed, "class_fraction": round(share, 6),
                   "stratified_by": "top-level folder", "budget": budget or "fit",
                   "budget_bytes": limit, "budget_from": how, "margin": margin,
                   "drawn_at_version": None if old is None else str(old.get("version"))}
    return picked


def _kept(sel: Selection, dest: Path, old: dict[str, Any], rule: dict[str, Any],
          note: Callable[[str], object]) -> Selection:
    """A refresh: the members of the published copy that SRC still has."""
    members = set(manifest.read(dest / MANIFEST))
    kept = narrow(sel, [e for e in sel.entries if e.rel in members])
    gone = len(members) - len(kept.entries)
    note(f"keeping the {len(kept.entries)} members of {dest} version {old.get('version')} "
         f"(--redraw draws them again)" + (f"; {gone} left the source" if gone else ""))
    kept.rule = {k: rule.get(k) for k in RULE_KEYS}
    return kept


def advice_for(sel: Selection, dest: Path, old: dict[str, Any] | None) -> Advice:
    """The selection (before any --fit) against what DEST's filesystem can take; `old`:
    the metadata of the copy published there (its bytes can be reused)."""
    available, _how = budget_bytes(None, home(dest), int((old or {}).get("bytes") or 0))
    return advise(sel.bytes, available, "the selection", f"the free space at {home(dest)}")
