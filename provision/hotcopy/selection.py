"""Which files of SRC a hot copy takes: a safe walk of SRC, then globs, a list file, or a
deterministic sample.

The walk never leaves SRC: a symlink is taken (as the file it names) only when it resolves
to a regular file inside SRC; symlinks to folders are not walked (no loops), and FIFOs,
sockets and devices are skipped. Every skip is reported, never silent.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
import stat
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, overload

from hotcache.provision.errors import UsageError
from hotcache.provision.system import beneath
from hotcache.provision.hotcopy.format import RESERVED, STAGING_SUFFIX
from hotcache.provision.hotcopy.spool import Spool


_STREAM_RECORDS = 1024   # records read at once by a pass over every entry (48 KiB)


@dataclass(frozen=True)
class Entry:
    rel: str          # path relative to SRC, '/'-separated (surrogateescape for odd bytes)
    size: int
    mtime_ns: int
    mode: int         # permission bits of the source file
    via_symlink: bool = False   # a symlink inside SRC to a file inside SRC
    dev: int = 0      # the file the walk saw (for a symlink: the file it names); the copy
    ino: int = 0      # opens exactly this file or refuses
    target: str = ""  # for a symlink: the path (relative to SRC) of the file it names

    @property
    def source(self) -> str:
        """What to open beneath SRC: the file itself, or the file a symlink names."""
        return self.target or self.rel


class Entries(Sequence[Entry]):
    """The entries of a selection kept out of memory: the paths in one byte string and the
    numbers in fixed 48-byte records, both spooled to unnamed temporary files (Spool), so
    the kernel keeps them in its page cache rather than in the process's memory. An Entry
    is made on demand when one is read. At millions of files this keeps a copy's memory
    almost flat in the file count (only the rare symlinks are held in memory)."""

    __slots__ = ("_blob", "_recs", "_targets", "_n", "bytes")
    _REC = struct.Struct("<6q")   # end of the path in _blob, size, mtime_ns, mode, dev, ino

    def __init__(self, entries: Iterable[Entry] = ()):
        self._blob = Spool()
        self._recs = Spool()
        self._targets: dict[int, str] = {}   # symlinks (rare): index -> the file named
        self._n = 0
        self.bytes = 0
        for e in entries:
            self.append(e)

    def append(self, e: Entry) -> None:
        if e.via_symlink:
            self._targets[self._n] = e.target
        self._blob += os.fsencode(e.rel)
        self._recs += self._REC.pack(len(self._blob), e.size, e.mtime_ns, e.mode, e.dev, e.ino)
        self._n += 1
        self.bytes += e.size

    def __len__(self) -> int:
        return self._n

    def _numbers(self, i: int) -> tuple[int, ...]:
        w = self._REC.size
        return self._REC.unpack(self._recs[i * w:(i + 1) * w])

    def _rel(self, i: int, end: int) -> str:
        start = self._numbers(i - 1)[0] if i else 0
        return os.fsdecode(self._blob[start:end])

    def rel(self, i: int) -> str:
        return self._rel(i, self._numbers(i)[0])

    def size(self, i: int) -> int:
        return self._numbers(i)[1]

    def mtime_ns(self, i: int) -> int:
        return self._numbers(i)[2]

    @overload
    def __getitem__(self, i: int) -> Entry: ...
    @overload
    def __getitem__(self, i: slice) -> list[Entry]: ...

    def __getitem__(self, i: int | slice) -> Entry | list[Entry]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        numbers = self._numbers(i)
        return self._entry(i, self._rel(i, numbers[0]), numbers)

    def __iter__(self) -> Iterator[Entry]:
        for i, (rel, numbers) in enumerate(self._stream()):
            yield self._entry(i, rel, numbers)

    def _entry(self, i: int, rel: str, numbers: tuple[int, ...]) -> Entry:
        """Entry i from its path and its record's numbers."""
        _end, size, mtime_ns, mode, dev, ino = numbers
        targets = self._targets
        return Entry(rel, size, mtime_ns, mode, i in targets, dev, ino, targets.get(i, ""))

    def rels(self) -> Iterator[str]:
        """Every path, in order (what a pass over the paths alone needs)."""
        return (rel for rel, _numbers in self._stream())

    def _stream(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """(path, numbers) of every entry in order, read a thousand records (and
        their paths) at a time: a pass over all entries costs two reads per block, not
        two reads and an Entry lookup per file."""
        w = self._REC.size
        per = _STREAM_RECORDS
        start = 0
        for first in range(0, self._n, per):
            records = self._recs[first * w:min(self._n, first + per) * w]
            stop = self._REC.unpack_from(records, len(records) - w)[0]
            blob, base = self._blob[start:stop], start
            for rec in self._REC.iter_unpack(records):
                end = rec[0]
                yield os.fsdecode(blob[start - base:end - base]), rec
                start = end

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or len(self) != len(other):
            return False
        return all(a == b for a, b in zip(self, other))
    # No __hash__: a class that defines __eq__ alone is unhashable, as a list is.


class Coverage(TypedDict, total=False):
    """The share of SRC a selection holds: every key, or none when the walk of SRC was
    not counted (a --list selection)."""
    source_files: int
    source_bytes: int | None
    fraction: float
    bytes_fraction: float
    partial: bool


@dataclass
class Selection:
    entries: Entries
    warnings: list[str] = field(default_factory=list)
    source_files: int | None = None     # every file under SRC (the walk), for the
    source_bytes: int | None = None     # share of the dataset a copy holds
    rule: dict[str, Any] = field(default_factory=dict)   # how a sized subset was drawn (--fit)

    def __post_init__(self) -> None:
        if not isinstance(self.entries, Entries):
            self.entries = Entries(self.entries)

    @property
    def coverage(self) -> Coverage:
        """The share of SRC this selection holds, as recorded in the copy's metadata."""
        if not self.source_files:
            return {}
        return {"source_files": self.source_files, "source_bytes": self.source_bytes,
                "fraction": round(len(self.entries) / self.source_files, 4),
                "bytes_fraction": round(self.bytes / self.source_bytes, 4)
                if self.source_bytes else 1.0,
                "partial": len(self.entries) < self.source_files}

    @property
    def bytes(self) -> int:
        return self.entries.bytes


def walk(src: Path) -> Selection:
    """Every regular file under `src` in path order, plus a warning for each thing
    skipped. Consumes `iter_walk`, storing each entry compactly (Entries)."""
    warnings: list[str] = []
    return Selection(Entries(iter_walk(src, warnings)), warnings)


def iter_walk(src: Path, warnings: list[str]) -> Iterator[Entry]:
    """Every regular file under `src`, one at a time, in the order of their relative
    paths (as sorted strings: the manifest's order); each skipped thing adds a warning.
    Folders are opened beneath their parent's descriptor with no symlink followed and
    checked to be the folder that was listed: a folder swapped for a symlink while the
    walk runs is skipped with a warning, never entered. Only the folders on the current
    path are held, never the whole tree."""
    src = src.resolve()
    root = beneath.open_root(src)
    try:
        yield from _walk_folder(src, root, "", warnings)
    finally:
        os.close(root)


def _walk_folder(src: Path, fd: int, top: str, warnings: list[str]) -> Iterator[Entry]:
    listed = []
    for name in os.listdir(fd):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        # A folder sorts as `name/`, so that the whole walk comes out in path order.
        listed.append((name + "/" if stat.S_ISDIR(st.st_mode) else name, name, st))
    listed.sort()
    for key, name, st in listed:
        rel = _join(top, name)
        if key.endswith("/"):
            try:
                sub = beneath.open_at(fd, name, beneath.DIR)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV, errno.ENOENT):
                    raise
                warnings.append(f"skipped {rel}: changed while the source was listed")
                continue
            try:
                if not beneath.same(os.fstat(sub), st):
                    warnings.append(f"skipped {rel}: changed while the source was listed")
                    continue
                yield from _walk_folder(src, sub, rel, warnings)
            finally:
                os.close(sub)
            continue
        if not top and (name in RESERVED or name.startswith(".hotcache-")
                        or name.endswith(STAGING_SUFFIX)):
            warnings.append(f"skipped {rel}: a hotcache file name")
            continue
        target = ""
        link = stat.S_ISLNK(st.st_mode)
        if link:
            real = Path(os.path.realpath(src / rel))
            if not real.is_relative_to(src):
                warnings.append(f"skipped {rel}: symlink points out of the source ({real})")
                continue
            try:
                st = os.stat(real, follow_symlinks=False)
            except FileNotFoundError:
                warnings.append(f"skipped {rel}: broken symlink")
                continue
            if stat.S_ISDIR(st.st_mode):
                warnings.append(f"skipped {rel}: symlink to a folder is not followed")
                continue
            target = real.relative_to(src).as_posix()
        if not stat.S_ISREG(st.st_mode):
            warnings.append(f"skipped {rel}: not a regular file ({_kind(st.st_mode)})")
            continue
        yield Entry(rel, st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode),
                    link, st.st_dev, st.st_ino, target)


def _join(top: str, name: str) -> str:
    return f"{top}/{name}" if top else name


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISDIR, "folder")):
        if test(mode):
            return name
    return "special file"


def matches(rel: str, pattern: str) -> bool:
    """rsync-like: a pattern with a '/' matches the whole relative path ('*' crosses
    folders), one without matches the file name or any folder on the way."""
    if "/" in pattern:
        return fnmatch.fnmatchcase(rel, pattern.strip("/")) or \
            fnmatch.fnmatchcase(rel, pattern.strip("/") + "/*")
    return any(fnmatch.fnmatchcase(part, pattern) for part in rel.split("/"))


def filter_globs(sel: Selection, include: list[str], exclude: list[str]) -> Selection:
    if not include and not exclude:
        return sel
    entries = (e for e in sel.entries
               if (not include or any(matches(e.rel, p) for p in include))
               and not any(matches(e.rel, p) for p in exclude))
    return narrow(sel, entries)


def narrow(sel: Selection, entries: Iterable[Entry]) -> Selection:
    """A narrower selection of the same walk."""
    return Selection(Entries(entries), sel.warnings, sel.source_files, sel.source_bytes)


def read_list(list_file: Path) -> list[str]:
    """Relative paths, one a line (blank lines and '#' comments ignored). Absolute paths
    and '..' are refused: a list must not reach outside SRC."""
    try:
        lines = list_file.read_text().splitlines()
    except OSError as exc:
        raise UsageError(f"--list {list_file}: cannot read it ({exc.strerror})") from None
    out, bad = [], []
    for n, line in enumerate(lines, 1):
        item = line.strip()
        if not item or item.startswith("#"):
            continue
        parts = Path(item).parts
        if item.startswith("/") or ".." in parts:
            bad.append(f"line {n}: {item!r}")
            continue
        out.append(Path(item).as_posix().rstrip("/"))
    if bad:
        raise UsageError(f"--list {list_file}: entries must be paths relative to SRC, without "
                         f"'..' or a leading '/':\n  " + "\n  ".join(bad),
                         hint="write each path as it appears under SRC, e.g. train/cat/001.jpg")
    return out


def filter_list(sel: Selection, wanted: list[str], list_file: Path | None) -> Selection:
    """Keep the listed files; a listed folder takes everything under it."""
    by_rel = {e.rel: e for e in sel.entries}
    keep: dict[str, Entry] = {}
    missing = []
    for item in wanted:
        if item in by_rel:
            keep[item] = by_rel[item]
            continue
        under = [e for e in sel.entries if e.rel.startswith(item + "/")]
        if not under:
            missing.append(item)
        keep.update((e.rel, e) for e in under)
    if missing:
        shown = "\n  ".join(missing[:10]) + ("\n  ..." if len(missing) > 10 else "")
        raise UsageError(f"--list {list_file}: {len(missing)} entries are not files or "
                         f"folders under the source:\n  {shown}",
                         hint="fix the list (paths are relative to SRC) and run again")
    return narrow(sel, sorted(keep.values(), key=lambda e: e.rel))


def _ranked_classes(sel: Selection, seed: int) -> list[list[Entry]]:
    """The files of each top-level folder (class), ranked by a hash of (seed, path): the
    same seed ranks the same files alike on every host, and files added later do not
    reshuffle the ones already ranked."""
    groups: dict[str, list[Entry]] = {}
    for e in sel.entries:
        groups.setdefault(e.rel.split("/", 1)[0] if "/" in e.rel else "", []).append(e)
    return [sorted(members, key=lambda e: hashlib.sha256(
        f"{seed}\0{e.rel}".encode("utf-8", "surrogateescape")).digest())
            for _cls, members in sorted(groups.items())]


def sample(sel: Selection, fraction: float, seed: int) -> Selection:
    """A deterministic sample of about `fraction` of the files of each top-level folder
    (each class keeps its share, and at least one file)."""
    picked: list[Entry] = []
    for ranked in _ranked_classes(sel, seed):
        picked.extend(ranked[:max(1, round(fraction * len(ranked)))])
    return narrow(sel, sorted(picked, key=lambda e: e.rel))


def fit(sel: Selection, budget: int, seed: int) -> tuple[Selection, float]:
    """The largest stratified sample whose bytes are at most `budget`: the same share f of
    every class (the first floor(f x n) of its ranked files), f as large as fits.
    Returns the sample and f."""
    ranked = _ranked_classes(sel, seed)
    prefix = []                       # bytes of the first k files of each class
    for members in ranked:
        sums = [0]
        for e in members:
            sums.append(sums[-1] + e.size)
        prefix.append(sums)

    def take(f: float) -> list[int]:
        return [int(f * len(m) + 1e-9) for m in ranked]

    def cost(f: float) -> int:
        return sum(p[k] for p, k in zip(prefix, take(f)))

    # Only the shares j/n_c change what is taken: search those (cost grows with f).
    shares = sorted({j / len(m) for m in ranked for j in range(1, len(m) + 1)})
    lo, hi, best = 0, len(shares) - 1, 0.0
    while lo <= hi:
        mid = (lo + hi) // 2
        if cost(shares[mid]) <= budget:
            best, lo = shares[mid], mid + 1
        else:
            hi = mid - 1
    picked = [e for m, k in zip(ranked, take(best)) for e in m[:k]]
    return narrow(sel, sorted(picked, key=lambda e: e.rel)), best


def select(src: Path, *, include: Sequence[str] = (), exclude: Sequence[str] = (),
           list_file: Path | None = None, fraction: float | None = None,
           seed: int = 0) -> Selection:
    """The files a copy of `src` takes, in path order."""
    if fraction is not None and not 0 < fraction <= 1:
        raise UsageError(f"--fraction {fraction}: must be above 0 and at most 1",
                         hint="e.g. --fraction 0.1 for a tenth of each class")
    wanted = read_list(list_file) if list_file is not None else None
    sel = walk(src)
    sel.source_files, sel.source_bytes = len(sel.entries), sel.bytes
    if wanted is not None:
        sel = filter_list(sel, wanted, list_file)
    sel = filter_globs(sel, list(include), list(exclude))
    if fraction is not None:
        sel = sample(sel, fraction, seed)
    return sel
