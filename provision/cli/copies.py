"""CLI commands for hot copies (copy, verify, warm, copies): registered on the main app.
Parsing and presentation only; the work is in copier.py, verify.py, warm.py, copies.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from hotcache.provision.cli.common import (JobsOpt, JsonOpt, StateOpt, console, emit, preload,
                                           print_table, refresh_index)
from hotcache.provision.errors import DriftError, ExitCode, UsageError
from hotcache.provision.system.meter import NullMeter, for_terminal
from hotcache.provision.system.sizes import size
MetricsDirOpt = typer.Option(
    None, "--metrics-dir", envvar="HOTCACHE_METRICS_DIR", show_envvar=True, metavar="DIR",
    help="While running, publish bytes and files done and left as metrics in DIR (node_"
         "exporter's textfile folder), so dashboards and init containers can wait for hot "
         "data [default: /var/lib/prometheus/node-exporter when writable; empty: off].")


def _meter(metrics_dir: Optional[Path] = None, operation: str = "",
           path: Optional[Path] = None) -> NullMeter:
    """Progress on stderr, with --json too (stdout carries only the document): a bar on
    a terminal, a line per interval elsewhere; and as metrics while running."""
    meter = for_terminal()
    if not operation or path is None:
        return meter
    from hotcache.provision.observe.progress import metrics_dir as where, wrap   # start-up: copy and warm only

    return wrap(meter, where(metrics_dir), operation, path)


def copy(
    src: Path = typer.Argument(..., help="The dataset folder to copy from (e.g. on the HDD array)."),
    dest: Path = typer.Argument(..., help="The hot copy to make or refresh (e.g. on the SSD mount)."),
    include: List[str] = typer.Option([], "--include", "-i", metavar="GLOB",
                                      help="Copy only matching files; repeatable. A glob with "
                                           "'/' matches the path under SRC, one without "
                                           "matches any file or folder name."),
    exclude: List[str] = typer.Option([], "--exclude", "-x", metavar="GLOB",
                                      help="Leave matching files out; repeatable."),
    list_file: Optional[Path] = typer.Option(None, "--list", metavar="FILE",
                                             help="Copy the files (or folders) listed, one "
                                                  "path relative to SRC a line."),
    fraction: Optional[float] = typer.Option(None, "--fraction", metavar="F",
                                             help="Copy a deterministic sample: this share "
                                                  "of each top-level folder (class)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the --fraction or --fit sample."),
    fit: bool = typer.Option(False, "--fit",
                             help="Copy the largest subset that fits the fast tier with the "
                                  "--margin: the same share of each top-level folder (class), "
                                  "drawn by --seed. For datasets larger than the SSD: read the "
                                  "rest from the origin (DATA_COLD_ROOT)."),
    budget: Optional[str] = typer.Option(None, "--budget", metavar="SIZE|PCT",
                                         help="Like --fit, within this budget: 80% of the "
                                              "fast tier's filesystem, or a size (200G)."),
    margin: float = typer.Option(0.2, "--margin",
                                 help="Free space required beyond the bytes to copy (0.2 = 20%)."),
    no_space_check: bool = typer.Option(False, "--no-space-check",
                                        help="Skip the free-space check (a full filesystem "
                                             "still fails cleanly)."),
    redraw: bool = typer.Option(False, "--redraw",
                                help="A refresh of a --fit copy keeps its members; this "
                                     "draws them again (with --fit or --budget)."),
    name: Optional[str] = typer.Option(None, "--name", help="Dataset name [default: SRC's name]."),
    version: Optional[str] = typer.Option(None, "--version",
                                          help="Version label [default: previous + 1, or 1]."),
    owner: Optional[str] = typer.Option(None, "--owner", metavar="USER:GROUP",
                                        help="Give the copy to this user (root only)."),
    mode: Optional[str] = typer.Option(None, "--mode", metavar="OCTAL",
                                       help="File permissions, e.g. 0644 (folders get x "
                                            "where r is set) [default: as in SRC]."),
    checksum: bool = typer.Option(False, "--checksum",
                                  help="On refresh, compare files by sha256 instead of size "
                                       "and modification time."),
    verify: bool = typer.Option(False, "--verify",
                                help="Before publishing, read the copy back from the device "
                                     "and check every hash (costs a second read of DEST)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say which files would be copied "
                                 "and whether they fit, and copy nothing."),
    jobs: int = JobsOpt, metrics_dir: Optional[Path] = MetricsDirOpt,
    bwlimit: Optional[str] = typer.Option(None, "--bwlimit", metavar="RATE",
                                          help="Read at most RATE bytes/s from SRC, e.g. 200M, "
                                               "to spare an array that training also reads."),
    as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
) -> None:
    """Copy (part of) a dataset to the fast tier as a verified hot copy.

    Files are hashed while they are copied, into a staging folder next to DEST, made
    durable, then published with one rename: DEST/SHA256SUMS (check it with `cd DEST &&
    sha256sum -c SHA256SUMS`) and DEST/.hotcache-copy.json. An interrupted copy resumes
    where it stopped; run again after SRC changed and only new or changed files are
    copied, then the new version replaces the old one in one step.

    Example: hotcache copy /data/imagenet/val /mnt/hot/imagenet-val --fraction 0.1 --seed 1

    Larger than the SSD: hotcache copy /data/in21k /mnt/hot/in21k --fit (or --budget 80%)
    """
    from hotcache.provision.hotcopy.copier import CopyOptions, copy as do_copy, parse_rate   # start-up: this command only

    opts = CopyOptions(include=list(include), exclude=list(exclude), list_file=list_file,
                       fraction=fraction, seed=seed, name=name, version=version, jobs=jobs,
                       owner=owner, mode=mode, checksum=checksum, margin=margin,
                       space_check=not no_space_check, bwlimit=parse_rate(bwlimit),
                       state=state, verify=verify, fit=fit, budget=budget, redraw=redraw,
                       dry_run=dry_run)
    meter = _meter(metrics_dir, "" if dry_run else "copy", dest)
    preload("hotcache.provision.hotcopy.catalog", "rich.console")   # for after the copy
    try:
        result = do_copy(src, dest, opts, meter)
    finally:
        meter.stop()
    if result.get("changed"):
        refresh_index(state)
    c = console()
    if as_json:
        return emit(result, "copy")
    if result.get("dry_run"):
        return c.print(f"dry run: would copy {result['copied_files']} files "
                       f"({size(result['copied_bytes'])}) to {dest} as {result['name']} version "
                       f"{result['version']}, keep {result['reused_files']} unchanged and resume "
                       f"{result['resumed_files']}; nothing was copied")
    if not result["changed"]:
        return c.print(f"{dest}: up to date ({result['name']} version {result['version']}, "
                       f"{result['files']} files, {size(result['bytes'])})")
    c.print(f"[green]published[/] {dest}: {result['name']} version {result['version']}, "
            f"{result['files']} files, {size(result['bytes'])}")
    c.print(f"  copied {result['copied_files']} files ({size(result['copied_bytes'])}), "
            f"kept {result['reused_files']} unchanged, resumed {result['resumed_files']}")
    if result.get("partial"):
        c.print(f"  holds {result['fraction']:.0%} of the files of {src} "
                f"({result['bytes_fraction']:.0%} of its bytes); read the rest from the "
                f"source: DATA_ROOT={dest} DATA_COLD_ROOT={src}")
    if verify:
        c.print("  verified: read back from the device, every sha256 matched, before publishing")
    c.print(f"  check it: cd {dest} && sha256sum -c --quiet SHA256SUMS")


def verify(
    dest: Path = typer.Argument(..., help="A hot copy."),
    fast: bool = typer.Option(False, "--fast", help="Counts, sizes, nothing missing or extra "
                                                    "(the default)."),
    sample: Optional[int] = typer.Option(None, "--sample", metavar="N",
                                         help="Also hash N files picked at random."),
    full: bool = typer.Option(False, "--full", help="Also hash every file."),
    jobs: int = JobsOpt, as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
) -> None:
    """Check a hot copy against its manifest; print each mismatch by path. Exits 5 when
    anything differs, and records the result (verified_at, verify_ok) in the copy."""
    from hotcache.provision.hotcopy.verify import verify as do_verify   # start-up: this command only

    if sum([fast, sample is not None, full]) > 1:
        raise UsageError("give one of --fast, --sample N, --full")
    mode = "full" if full else "sample" if sample is not None else "fast"
    meter = _meter()
    try:
        report = do_verify(dest, mode, sample or 0, jobs, meter, state)
    finally:
        meter.stop()
    if report["recorded"]:
        refresh_index(state)
    c = console()
    if as_json:
        emit(report, "verify")
        if not report["ok"]:
            raise typer.Exit(ExitCode.DRIFT)
        return
    for p in report["problems"]:
        c.print(f"[red]MISMATCH[/] {p['path']}: {p['problem']}", soft_wrap=True)
    if not report["ok"]:
        raise DriftError(f"{dest}: {len(report['problems'])} problems found ({mode} check)",
                         hint=f"run `hotcache copy SRC {dest}` again: it copies "
                                "the damaged files afresh and publishes a new version")
    c.print(f"[green]ok[/] {dest}: {report['files']} files, {report['hashed_files']} hashed "
            f"({mode})")


def warm(
    path: Path = typer.Argument(..., help="A hot copy or any folder to read."),
    max_passes: int = typer.Option(8, "--max-passes", min=1,
                                   help="Block caches: most full passes to read."),
    order: Optional[Path] = typer.Option(
        None, "--order", metavar="FILE",
        help="Read only the files FILE lists (one path per line, relative to PATH: the "
             "next epoch's order, as make_loader(order_file=...) writes it), once, in "
             "that order, into the page cache."),
    jobs: int = JobsOpt, as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
    metrics_dir: Optional[Path] = MetricsDirOpt,
) -> None:
    """Read every file (in parallel) so that training finds it cached. With a hotcache
    block cache behind PATH, passes reach the device and the hit ratio and cache use
    are shown before and after, and PATH is read again until a pass's reads hit the cache
    (at most 0.5% of its bytes came from the origin device); dm-cache and lvmcache first
    re-read the files window by window, as their smq policy promotes gradually.

    With --order FILE: read the cold part of the next epoch ahead, in the order training
    will read it (e.g. `hotcache warm /data/ds --order /run/train/next-epoch.txt`
    beside the training job)."""
    from hotcache.provision.tend.warm import warm as do_warm   # start-up: this command only

    meter = _meter(metrics_dir, "warm", path)
    try:
        report = do_warm(path, jobs=jobs, max_passes=max_passes, state=state, meter=meter,
                         order=order)
    finally:
        meter.stop()
    c = console()
    if as_json:
        return emit(report, "warm")
    last = report["passes"][-1]
    c.print(f"warmed {path}: {report['files']} files, {size(report['bytes'])}, "
            f"{len(report['passes'])} pass(es), last {last['mib_per_s']} MiB/s "
            f"({report['backend']}: {report['stopped']})")
    for label, st in (("before", report["before"]), ("after", report["after"])):
        if st:
            c.print(f"  {label}: hit ratio {st.get('hit_ratio')}, cache used "
                    f"{size(st.get('cache_used_bytes'))} of {size(st.get('cache_total_bytes'))}")


def copies(
    roots: List[Path] = typer.Argument(None, help="Folders to look in as well (e.g. the SSD "
                                                  "mount) [default: only the mapping]."),
    as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
) -> None:
    """List hot copies: name, version, path, files, bytes, last verified and state."""
    from hotcache.provision.hotcopy.catalog import find   # start-up: the mapping's pydantic models

    rows = find([Path(os.path.abspath(r)) for r in roots or []], state)
    c = console()
    if as_json:
        return emit({"copies": rows}, "copies")
    if not rows:
        return c.print("no hot copies found; `hotcache copy SRC DEST` makes one")
    print_table(("name", "version", "path", "files", "bytes", "last verified", "state"),
                ((r["name"] or "-", r["version"] or "-", r["path"], str(r["files"] or "-"),
                  size(r["bytes"]), r["verified_at"] or "never", r["state"]) for r in rows))


def prune(
    roots: List[Path] = typer.Argument(None, help="Folders to look in as well [default: the "
                                                  "mounts in the mapping]."),
    keep: int = typer.Option(2, "--keep", metavar="N", help="Versions of each hot copy "
                                                             "(same name) to keep."),
    staging_hours: float = typer.Option(24, "--staging-hours", metavar="H",
                                        help="Staging folders untouched this long (and not "
                                             "locked by a copy) are abandoned."),
    tf_cache: List[Path] = typer.Option([], "--tf-cache", metavar="DIR",
                                        help="A tf.data cache folder (make_dataset's "
                                             "cache_dir) to prune too; repeatable."),
    keep_keys: Optional[Path] = typer.Option(None, "--keep-keys", metavar="FILE",
                                             help="tf.data cache keys still in use, one a "
                                                  "line: the others are pruned."),
    older_than: Optional[float] = typer.Option(None, "--older-than", metavar="DAYS",
                                               help="tf.data caches no pipeline used for "
                                                    "this long are pruned."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete (default: only list)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only list, even with --yes "
                                 "(what prune does without --yes)."),
    as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
) -> None:
    """Remove what the fast tier no longer needs: old versions of hot copies beyond
    --keep, abandoned staging folders, copies whose source is gone, and stale tf.data
    caches. Lists what it would delete and the bytes freed; --yes deletes exactly that.
    Anything a running process holds open is kept and named."""
    # start-up: the mapping's pydantic models, for this command only
    from hotcache.provision.hotcopy import prune as p
    from hotcache.provision.hotcopy.catalog import drop_stale_asides, recorded_asides

    yes = yes and not dry_run
    if tf_cache and keep_keys is None and older_than is None:
        raise UsageError("--tf-cache needs --keep-keys FILE or --older-than DAYS",
                         hint="say which caches are stale: a list of current keys, or an age")
    keys = None
    if keep_keys is not None:
        try:
            keys = {k.strip() for k in keep_keys.read_text().splitlines() if k.strip()}
        except OSError as exc:
            raise UsageError(f"--keep-keys {keep_keys}: cannot read it ({exc.strerror})") from None
    for r in [*(roots or []), *tf_cache]:
        if not r.is_dir():
            raise UsageError(f"{r}: not a folder", hint="give folders that hold hot copies")
    where = [Path(os.path.abspath(r)) for r in roots or []] or p.roots_from_mapping(state)
    found = p.find(where, keep=keep, staging_hours=staging_hours,
                   tf_caches=[Path(os.path.abspath(t)) for t in tf_cache], keep_keys=keys,
                   older_than_days=older_than, recorded=p.recorded_copies(state),
                   asides=recorded_asides(state))
    doomed = [c for c in found if not c.busy and not c.kept]
    if yes:
        for c in doomed:
            p.remove(c, state)
        drop_stale_asides(state)
        refresh_index(state)
    c_ = console()
    total = sum(c.bytes for c in doomed)
    if as_json:
        return emit({"dry_run": not yes, "roots": [str(w) for w in where],
                     "candidates": [c.to_dict() for c in doomed],
                     "kept_busy": [c.to_dict() for c in found if c.busy],
                     "kept_not_ours": [c.to_dict() for c in found if c.kept],
                     "bytes": total, "freed_bytes": total if yes else 0}, "prune")
    verb = "removed" if yes else "would remove"
    for c in doomed:
        c_.print(f"{verb} {c.path} ({size(c.bytes)}): {c.why}", soft_wrap=True)
    for c in found:
        if c.busy:
            c_.print(f"[yellow]kept[/] {c.path}: held open by {c.busy}", soft_wrap=True)
        elif c.kept:
            c_.print(f"[yellow]kept[/] {c.path}: {c.kept}", soft_wrap=True)
    if not found:
        return c_.print(f"nothing to prune under {', '.join(map(str, where)) or '(no roots)'}")
    c_.print(f"{'freed' if yes else 'would free'} {size(total)} in {len(doomed)} folder(s)"
             + ("" if yes else "; run again with --yes to delete them"))


def register(app: typer.Typer) -> None:
    for command in (copy, verify, warm, copies, prune):
        app.command()(command)
