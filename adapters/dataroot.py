"""`data_root()`: the one switch between the cold source and the hot copy, and the one
log line that says which of the two a training job really read.

    root = data_root("/mnt/hdd/imagenet")        # DATA_ROOT wins when set
    root = data_root(expect="hot")               # refuse anything but a verified hot copy
    root = data_root(hot="/mnt/hot/ds", cold="/data/ds")   # tiered: see tiered.py

The line is logged once per call on the `hotcache.adapters` logger, as `key=value` text,
or as one JSON object when `json_log=True` or HOTCACHE_LOG=json; a script that set up
no logging shows it on stderr (see logs.py). A DataRoot is the path wherever a path
goes: `open()`, `os.path`, `str(root)`, `f"{root}/train-{{000..099}}.tar"`.

In a container the data is a bind mount of a folder of the host's cache filesystem. What
the container sees can go stale: bind mounts default to `rprivate`, so after the host
rebuilds the cache the container still holds the old filesystem (moby#17034). When the
host's mapping is visible (HOTCACHE_STATE, or /etc/hotcache mounted read-only), the
filesystem the kernel serves at the path (its UUID and label) is compared with the one
the mapping now records for that cache: `view=stale` plus a warning when they differ,
`view=unknown` when there is nothing to compare with.

    python -m hotcache.adapters      # log the line; exit 1 unless DATA_ROOT is what
                                     # DATA_ROOT_EXPECT asks (a job's first command)
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import DataRootError
from hotcache.provision.hotcopy.format import STAGING_SUFFIX, CopyState, copy_state, staging_dir

from .blockinfo import SYS_DEV_BLOCK, Backing, backing_of
from .logs import mode, ready
from .tiered import ENV_COLD, Tiers, count_files

ENV = "DATA_ROOT"
ENV_EXPECT = "DATA_ROOT_EXPECT"
ENV_STATE = "HOTCACHE_STATE"
ENV_UNSET_REASON = "DATA_ROOT_UNSET_REASON"   # set by hotcache's Slurm TaskProlog
EXPECT = (None, "hot", "partial", "any")
DEFAULT_STATE = "/etc/hotcache/mappings.yaml"
_current: DataRoot | None = None      # the data root this process resolved last


@dataclass(frozen=True)
class View:
    """Whether the filesystem seen at the path is the one the host's mapping now records:
    fresh, stale (with why) or unknown (with why not)."""

    state: str = "unknown"
    reason: str | None = None
    cache: str | None = None         # the mapping's cache holding the filesystem
    backend: str | None = None


@dataclass(frozen=True)
class HotCopy:
    """What the hot copy's metadata says. `state` is one of:
    hot        complete and verified
    unverified complete, but its last verification failed or never ran
    unrecorded on a cache the host's mapping records, but not a copy the mapping records
               there (anyone who can write to a shared hot tier can write metadata)
    staging    a copy being written (or left half-written): never hot
    cold       no hot copy here
    `copy_state` is the finer state `hotcache copies` prints (format.CopyState)."""

    state: str
    root: str | None = None          # the copy's top folder (DATA_ROOT may be inside it)
    name: str | None = None
    version: str | None = None
    verified_at: str | None = None
    files: int | None = None
    partial: bool = False            # holds a subset of its source (--fit, --fraction)
    fraction: float | None = None    # the share of the source's files it holds
    copy_state: str | None = None

    @property
    def is_hot(self) -> bool:
        return self.state == "hot"


@dataclass(frozen=True)
class DataRoot(os.PathLike[str]):
    """The data root a job reads, and what it is. `str()`, f-strings and `os.fspath()`
    give the path; `root / "train"` is a Path."""

    path: Path
    source: str                      # "DATA_ROOT" or "default"
    copy: HotCopy
    backing: Backing
    rank: dict[str, str] = field(default_factory=dict)
    view: View = field(default_factory=View)
    tiers: Tiers | None = None       # DATA_COLD_ROOT given: the rest is read from there

    @property
    def hot(self) -> str:
        """'yes' (a whole verified hot copy), 'partial' (a verified subset) or 'no'."""
        if not self.copy.is_hot:
            return "no"
        return "partial" if self.copy.partial else "yes"

    @property
    def fraction(self) -> float:
        """The share of the dataset's files read from the hot copy."""
        if self.hot == "no":
            return 0.0
        if self.tiers is None or self.copy.root is None or Path(self.copy.root) == self.path:
            return self.copy.fraction if self.copy.partial and self.copy.fraction else 1.0
        return self.tiers.fraction(count_files(self.tiers.cold))

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __format__(self, spec: str) -> str:
        return format(str(self.path), spec)

    def __truediv__(self, other: str | os.PathLike[str]) -> Path:
        return self.path / other

    def to_dict(self) -> dict[str, Any]:
        return {"event": "data_root", "path": str(self.path), "source": self.source,
                "hot": self.copy.is_hot, "hot_level": self.hot, "fraction": self.fraction,
                "cold": str(self.tiers.cold) if self.tiers else None, "copy": asdict(self.copy),
                "fs": self.backing.fstype, "mountpoint": self.backing.mountpoint,
                "device": self.backing.device, "devnum": self.backing.devnum,
                "cache": self.backing.cache, "device_detail": self.backing.detail,
                "rotational": self.backing.rotational, "mount_root": self.backing.mount_root,
                "fs_uuid": self.backing.fs_uuid, "view": self.view.state,
                "view_reason": self.view.reason, "mapped_cache": self.view.cache, **self.rank}

    def log_line(self) -> str:
        c, b = self.copy, self.backing
        parts = [f"data_root path={self.path}", f"source={self.source}",
                 f"hot={self.hot}"]
        if self.hot == "partial" or self.tiers:
            parts.append(f"fraction={self.fraction:.2f}")
        parts.append(f"copy={c.state}")
        if self.tiers:
            parts.append(f"cold={self.tiers.cold}")
        if c.state != "cold":
            parts += [f"name={c.name}", f"version={c.version}", f"verified_at={c.verified_at}"]
        parts += [f"fs={b.fstype}", f"device={b.device or b.source}", f"cache={b.cache}"]
        if b.cache_failed:
            parts.append("cache_state=failed")
        if b.mount_root not in (None, "/"):
            parts.append(f"mount_root={b.mount_root}")
        parts.append(f"view={self.view.state}")
        parts += [f"{k.lower()}={v}" for k, v in self.rank.items()]
        return " ".join(parts)


def hot_copy_at(path: Path) -> HotCopy:
    """Find the hot copy that holds `path` (itself or a parent folder)."""
    for folder in (path, *path.parents):
        state, meta = copy_state(folder)
        if meta is not None:
            return HotCopy("hot" if state.verified else "unverified", str(folder),
                           meta.get("name"),
                           None if meta.get("version") is None else str(meta.get("version")),
                           meta.get("verified_at"), meta.get("files"), *_coverage(meta),
                           copy_state=state.value)
        if state == CopyState.INTERRUPTED:
            # a copy in progress, or one that died half-way: never hot
            staging = folder if folder.name.endswith(STAGING_SUFFIX) else staging_dir(folder)
            return HotCopy("staging", str(staging), copy_state=state.value)
        if folder.is_mount():
            break                                     # a hot copy never spans filesystems
    return HotCopy("cold")


def _coverage(meta: dict[str, Any]) -> tuple[bool, float | None]:
    """Whether a copy holds only part of its source, and which share of its files."""
    sel = meta.get("selection") or {}
    share = sel.get("fraction")
    partial = bool(meta.get("partial")) or sel.get("rule") == "fit" or \
        (share is not None and share < 1)
    return partial, meta.get("fraction")


def _resolve(default: str | os.PathLike[str] | None) -> tuple[Path, str]:
    raw = os.environ.get(ENV)
    if raw:
        tried = [f"{ENV}={raw} -> {Path(raw).expanduser().resolve()}"]
        candidate, source = Path(raw), ENV
        if default is not None:
            tried.append(f"default={default} (not used: {ENV} is set and wins)")
    elif default is not None:
        tried = [f"{ENV} is unset", f"default={default} -> {Path(default).expanduser().resolve()}"]
        candidate, source = Path(default), "default"
    else:
        why = os.environ.get(ENV_UNSET_REASON)
        if why:
            raise DataRootError(f"{ENV} is not set: {why}",
                                hint="the node's administrator runs `hotcache verify --full` "
                                     "or `hotcache copy` to make the hot copy good again")
        raise DataRootError(f"{ENV} is not set and no default was given",
                            hint=f"export {ENV}=/path/to/dataset (the hot copy or the source)")
    path = candidate.expanduser().resolve()
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise DataRootError(f"data root {path} {what}; tried: " + "; ".join(tried),
                            hint=f"point {ENV} at an existing dataset folder")
    return path, source


def _mapping() -> tuple[dict[Any, Any] | None, str]:
    """The host's mapping, if this process can see it: (caches or None, path or why not).
    The caches are the YAML as read: nothing here checks what its keys hold."""
    path = os.environ.get(ENV_STATE) or DEFAULT_STATE
    try:
        text = Path(path).read_text()
    except OSError as exc:
        return None, (f"the host's mapping {path} is not visible here ({exc.strerror}); mount "
                      f"/etc/hotcache read-only (or set {ENV_STATE}) to check for a stale view")
    try:
        import yaml   # only here: the adapters import no YAML parser up front
    except ImportError:
        return None, "PyYAML is not installed here, so the host's mapping cannot be read"
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return None, f"the host's mapping {path} is not valid YAML"
    caches = data.get("caches") if isinstance(data, dict) else None
    return (caches, path) if isinstance(caches, dict) else (None, f"{path} is not a hotcache mapping")


def check_view(b: Backing) -> View:
    """Compare the filesystem the kernel serves here with what the host's mapping records
    now (see the module doc)."""
    return _view(b)[0]


def _view(b: Backing) -> tuple[View, dict[Any, Any] | None]:
    """check_view, with the mapping's caches it read (None when it read none, or could
    not): describe() hands them on to _recorded, so one call parses the mapping once."""
    major = (b.devnum or "0:0").split(":")[0]
    if b.devnum and major != "0" and SYS_DEV_BLOCK.is_dir() and \
            not (SYS_DEV_BLOCK / b.devnum).exists():
        return View("stale", f"the block device {b.devnum} under {b.mountpoint} no longer "
                             "exists on the host: this mount outlived the cache it showed; "
                             "restart the container"), None
    caches, where = _mapping()
    return _compare(b, caches, where), caches


def _compare(b: Backing, caches: dict[Any, Any] | None, where: str) -> View:
    """The view, from the mapping's caches (None: not visible, and `where` says why)."""
    if caches is None:
        return View("unknown", where)
    if not b.fs_uuid:
        return View("unknown", f"the kernel does not report the UUID of the {b.fstype} "
                               f"filesystem at {b.mountpoint}")
    fs_of = {name: (e.get("filesystem") or {}) for name, e in caches.items() if isinstance(e, dict)}
    for name, fs in fs_of.items():
        if str(fs.get("uuid") or "").lower() == b.fs_uuid:
            return View("fresh", None, name, caches[name].get("backend"))
    for name, fs in fs_of.items():
        if b.fs_label and fs.get("label") == b.fs_label:
            return View("stale", f"{b.mountpoint} shows filesystem {b.fs_uuid} (label "
                                 f"{b.fs_label}), but the host's mapping {where} now has cache "
                                 f"{name} on filesystem {fs.get('uuid')}: the host rebuilt it "
                                 "after this mount was made. Restart the container; bind the "
                                 "folder above the cache mount with bind-propagation=rslave "
                                 "so that remounts reach it", name, caches[name].get("backend"))
    return View("unknown", f"filesystem {b.fs_uuid} at {b.mountpoint} is not one the host's "
                           f"mapping {where} records")


def describe(path: str | os.PathLike[str], source: str = "argument",
             cold: str | os.PathLike[str] | None = None) -> DataRoot:
    """What `path` is (hot copy or not, filesystem, device, cache, whether the view is
    stale), without logging; with `cold`, which of its files the hot copy serves (the
    rest come from `cold`)."""
    path = Path(path).resolve()
    rank = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if os.environ.get(k)}
    backing = backing_of(path)
    copy = hot_copy_at(path)
    view, caches = _view(backing)
    copy = _recorded(copy, view, caches)
    tiers = Tiers.of(path, Path(cold).resolve(), copy.root, copy.is_hot) if cold else None
    return DataRoot(path, source, copy, backing, rank, view, tiers)


def _recorded(copy: HotCopy, view: View, caches: dict[Any, Any] | None) -> HotCopy:
    """On a cache the host's mapping records (a fresh view), a copy is hot only when the
    mapping records a copy at that folder: the same inode and owner (the paths differ in
    a container). Where the mapping is not visible, the metadata is all there is.
    `caches`: the mapping's caches as the view was judged from (the same parse: a view
    found fresh in one reading of the file is never checked against another)."""
    if copy.state not in ("hot", "unverified") or view.state != "fresh" or copy.root is None:
        return copy
    entry = (caches or {}).get(view.cache) or {}
    records = entry.get("hot_copies") or {}
    try:
        st = os.lstat(copy.root)
    except OSError:
        return replace(copy, state="unrecorded")
    for where, rec in records.items() if isinstance(records, dict) else ():
        if not isinstance(rec, dict):
            continue
        if (rec.get("inode"), rec.get("uid")) == (st.st_ino, st.st_uid) or \
                (rec.get("inode") is None and where == copy.root):    # recorded before
            return copy                                               # inodes were kept
    return replace(copy, state="unrecorded")


def _cold_root(cold: str | os.PathLike[str] | None) -> Path | None:
    raw = os.environ.get(ENV_COLD) or cold
    if not raw:
        return None
    path = Path(raw).expanduser().resolve()
    if not path.is_dir():
        name = f"{ENV_COLD}={raw}" if os.environ.get(ENV_COLD) else f"cold={raw}"
        raise DataRootError(f"cold root {path} ({name}) is not a directory",
                            hint="point it at the whole dataset on the origin (the hot "
                                 "copy's source)")
    return path


def data_root(default: str | os.PathLike[str] | None = None, expect: str | None = None, *,
              hot: str | os.PathLike[str] | None = None, cold: str | os.PathLike[str] | None = None,
              json_log: bool | None = None, logger: logging.Logger | None = None) -> DataRoot:
    """Resolve DATA_ROOT (or `default`, or `hot`), describe it, log one line, return it.

    expect="hot" (or DATA_ROOT_EXPECT=hot) raises DataRootError unless the path is a
    complete, verified hot copy: a training job that asked for the SSD never silently
    reads the HDD instead. expect="partial" also accepts a verified subset (`copy --fit`).

    cold (or DATA_COLD_ROOT): the whole dataset on the origin; files the hot copy lacks
    are read from there (tiered reads, see tiered.py)."""
    if hot is not None and default is not None:
        raise DataRootError("give data_root() either a default or hot=, not both")
    path, source = _resolve(hot if hot is not None else default)
    expect = expect or os.environ.get(ENV_EXPECT) or None
    if expect not in EXPECT:
        raise DataRootError(f"expect={expect!r} is not understood",
                            hint="use expect='hot', expect='partial' or leave it unset")
    root = describe(path, source, _cold_root(cold))
    global _current
    _current = root
    if json_log is None:
        json_log = mode() == "json"
    target = ready(logger)
    if target is not None:
        target.info(json.dumps(root.to_dict(), sort_keys=True) if json_log else root.log_line())
    if root.view.state == "stale" and (target := ready(logger, logging.WARNING)):
        target.warning(f"data_root STALE: {root.view.reason}")
    if root.backing.cache_failed and (target := ready(logger, logging.WARNING)):
        target.warning(f"data_root: cache failed: {root.backing.cache_failed}; "
                       "`hotcache status` on the host says what to do")
    if expect == "hot" and root.hot == "partial":
        raise DataRootError(f"{ENV} {path} is a partial hot copy ({root.fraction:.0%} of its "
                            f"source's files), and a whole hot copy was expected",
                            hint="pass expect='partial' (DATA_ROOT_EXPECT=partial) to train "
                                 f"on it, with {ENV_COLD} for the rest")
    if expect in ("hot", "partial") and not root.copy.is_hot:
        why = {"cold": "is not a hot copy (no complete hotcache metadata in it or above it)",
               "staging": f"is a half-written hot copy (staging folder {root.copy.root})",
               "unverified": f"is a hot copy at {root.copy.root} whose last verification did not pass",
               "unrecorded": f"holds hot-copy metadata at {root.copy.root}, but the host's "
                             f"mapping records no copy there (not made by hotcache, or "
                             f"replaced since)"}
        unset = os.environ.get(ENV_UNSET_REASON) if source != ENV else None
        raise DataRootError(f"{ENV} {path} {why[root.copy.state]}, and a hot copy was expected"
                            + (f" ({ENV} is not set: {unset})" if unset else ""),
                            hint="run `hotcache copy` / `hotcache verify`, or unset DATA_ROOT_EXPECT")
    return root


def current() -> DataRoot | None:
    """The data root data_root() resolved last in this process (None before any): what
    the timing figures published beside it describe (dataset, version, hot)."""
    return _current


def main() -> int:
    """`python -m hotcache.adapters`: log the line to stdout; exit 1 with the
    reason when DATA_ROOT is missing or not what DATA_ROOT_EXPECT asks."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    try:
        data_root()
    except DataRootError as err:
        sys.stderr.write(f"data_root: {err}\n")
        return 1
    return 0
