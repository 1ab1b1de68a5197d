"""How much of a dataset the fast tier can hold, and what to do about it.

The origin documents ask for a cache of 1.2 to 1.5 times the data an epoch reads. Below
the data's size a block cache thrashes: each epoch reads every sample once in a new
random order, so LRU-like replacement evicts blocks before their next use (Alluxio#10322:
144 GB of data on a 120 GB cache trained no faster than with no cache). A pinned subset
that never evicts serves a fixed share of each epoch instead (CoorDL's MinIO cache;
petastorm#814: 34 h down to 9 h). Standard library only: the adapters' advice reads it too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final, Literal, TypedDict

from hotcache.provision.errors import UsageError
from hotcache.provision.system import sizes

MARGIN_LOW = 1.2       # cache >= 1.2 x data: fits with the margin the documents ask for
MARGIN_HIGH = 1.5

Case = Literal["fits with margin", "fits without margin", "does not fit"]
FITS: Final = "fits with margin"
TIGHT: Final = "fits without margin"
SPILLS: Final = "does not fit"


class AdviceDoc(TypedDict):
    """An Advice as the --json documents carry it (status' working set, copy's sizing)."""
    case: Case
    need_bytes: int
    capacity_bytes: int
    ratio: float | None
    hot_share: float
    message: str


@dataclass(frozen=True)
class Advice:
    case: Case                # FITS, TIGHT or SPILLS
    need_bytes: int           # what is to be cached
    capacity_bytes: int       # what the fast tier holds
    ratio: float | None       # capacity / need
    hot_share: float          # share of the data a --fit subset (with the margin) holds
    message: str

    def to_dict(self) -> AdviceDoc:
        return {"case": self.case, "need_bytes": self.need_bytes,
                "capacity_bytes": self.capacity_bytes, "ratio": self.ratio,
                "hot_share": self.hot_share, "message": self.message}


def advise(need: int, capacity: int, what: str = "the data",
           where: str = "the fast tier", margin: float = MARGIN_LOW - 1) -> Advice:
    """Which of the three cases applies, said plainly."""
    ratio = capacity / need if need > 0 else None
    share = 1.0 if need <= 0 else min(1.0, capacity / (1 + margin) / need)
    amounts = f"{what} is {sizes.size(need)}, {where} holds {sizes.size(capacity)}"
    if need <= 0 or capacity >= need * (1 + margin):
        return Advice(FITS, need, capacity, ratio, 1.0,
                      f"{amounts}: it fits with the {MARGIN_LOW}-{MARGIN_HIGH}x margin")
    if capacity >= need:
        return Advice(TIGHT, need, capacity, ratio, share,
                      f"{amounts} ({ratio:.2f}x): it fits without margin; a block cache "
                      f"will evict some of it each epoch, a hot copy leaves no room to "
                      f"refresh. Give it {MARGIN_LOW}-{MARGIN_HIGH}x the data, or pin a "
                      f"subset with `hotcache copy SRC DEST --fit` ({share:.0%} of it)")
    return Advice(SPILLS, need, capacity, ratio, share,
                  f"{amounts} ({ratio:.2f}x): it does not fit. A block cache will thrash "
                  f"(each epoch reads every sample in a new order and evicts blocks before "
                  f"their next use); pin a subset instead with `hotcache copy SRC DEST "
                  f"--fit` and read the rest from the origin (DATA_COLD_ROOT): expected "
                  f"hot share {share:.0%} of each epoch")


def budget_size(text: str, option: str = "--budget") -> int:
    """'200G' -> bytes (K, M, G, T are powers of 1024; a trailing B or iB is allowed)."""
    try:
        return sizes.parse_size(text)
    except ValueError:
        raise UsageError(f"{option} {text}: give a size (e.g. 200G) or a share of the fast "
                         f"tier (e.g. 80%)") from None


def budget_bytes(spec: str | None, folder: os.PathLike[str], reusable: int = 0) -> tuple[int, str]:
    """The bytes a copy into `folder`'s filesystem may take, and how that was decided.

    spec None (--fit): the free space plus `reusable` (the copy being refreshed, whose
    files are kept or replaced); "80%": that share of the filesystem's size; "200G": that
    size. A budget above what is free (plus reusable) is cut down to it."""
    st = os.statvfs(folder)
    available = st.f_bavail * st.f_frsize + reusable
    if spec is None:
        return available, "free space" + (" + the copy it replaces" if reusable else "")
    text = spec.strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            pct = -1
        if not 0 < pct <= 100:
            raise UsageError(f"--budget {spec}: a share must be above 0% and at most 100%",
                             hint="e.g. --budget 80%")
        want, how = int(st.f_blocks * st.f_frsize * pct / 100), f"{pct:g}% of the filesystem"
    else:
        want, how = budget_size(text), f"--budget {text}"
    if want > available:
        return available, f"{how}, cut to the free space"
    return want, how
