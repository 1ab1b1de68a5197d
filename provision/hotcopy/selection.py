"""Which files of SRC a hot copy takes: a safe walk of SRC, then globs, a list file, or a
deterministic sample.

The walk never leaves SRC: a symlink is taken (as the file it names) only when it resolves
to a regular file inside SRC; symlinks to folders are not walked (no loops), and FIFOs,
sockets and devices are skipped. Every skip is reported, never silent.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from hotcache.provision.errors import UsageError
from hotcache.provision.hotcopy.format import RESERVED, STAGING_SUFFIX


@dataclass(frozen=True)
class Entry:
    rel: str          # path relative to SRC, '/'-separated
    size: int
    mtime_ns: int
    mode: int         # permission bits of the source file
    via_symlink: bool = False   # a symlink inside SRC to a file inside SRC


@dataclass
class Selection:
    entries: list[Entry]
    warnings: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries)


def walk(src: Path) -> Selection:
    """Every regular file under `src` (sorted), plus a warning for each thing skipped."""
    src = src.resolve()
    entries: list[Entry] = []
    warnings: list[str] = []
    for dirpath, dirnames, filenames in os.walk(src, onerror=_raise):
        dirnames.sort()
        top = Path(dirpath)
        # Symlinked folders show up in dirnames; os.walk does not follow them, say so.
        for d in [d for d in dirnames if os.path.islink(top / d)]:
            warnings.append(f"skipped {_rel(src, top / d)}: symlink to a folder is not followed")
        for name in sorted(filenames):
            path = top / name
            rel = _rel(src, path)
            if top == src and (name in RESERVED or name.startswith(".hotcache-")
                               or name.endswith(STAGING_SUFFIX)):
                warnings.append(f"skipped {rel}: a hotcache file name")
                continue
            st = os.lstat(path)
            link = stat.S_ISLNK(st.st_mode)
            if link:
                target = path.resolve()
                if not target.is_relative_to(src):
                    warnings.append(f"skipped {rel}: symlink points out of the source ({target})")
                    continue
                try:
                    st = os.stat(target)
                except FileNotFoundError:
                    warnings.append(f"skipped {rel}: broken symlink")
                    continue
            if not stat.S_ISREG(st.st_mode):
                warnings.append(f"skipped {rel}: not a regular file ({_kind(st.st_mode)})")
                continue
            entries.append(Entry(rel, st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode), link))
    return Selection(entries, warnings)


def _raise(err: OSError) -> None:
    raise err


def _rel(src: Path, path: Path) -> str:
    return path.relative_to(src).as_posix()


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
    entries = [e for e in sel.entries
               if (not include or any(matches(e.rel, p) for p in include))
               and not any(matches(e.rel, p) for p in exclude)]
    return Selection(entries, sel.warnings)


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


def filter_list(sel: Selection, wanted: list[str], list_file: Path) -> Selection:
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
    return Selection(sorted(keep.values(), key=lambda e: e.rel), sel.warnings)


def sample(sel: Selection, fraction: float, seed: int) -> Selection:
    """A deterministic sample of about `fraction` of the files of each top-level folder
    (each class keeps its share, and at least one file). Files are ranked by a hash of
    (seed, path), so the same seed picks the same files on every host, and files added
    later do not reshuffle the ones already picked."""
    groups: dict[str, list[Entry]] = {}
    for e in sel.entries:
        groups.setdefault(e.rel.split("/", 1)[0] if "/" in e.rel else "", []).append(e)
    picked: list[Entry] = []
    for members in groups.values():
        k = max(1, round(fraction * len(members)))
        ranked = sorted(members, key=lambda e: hashlib.sha256(f"{seed}\0{e.rel}".encode()).digest())
        picked.extend(ranked[:k])
    return Selection(sorted(picked, key=lambda e: e.rel), sel.warnings)


def select(src: Path, *, include: list[str] = (), exclude: list[str] = (),
           list_file: Path | None = None, fraction: float | None = None,
           seed: int = 0) -> Selection:
    """The files a copy of `src` takes, in path order."""
    if fraction is not None and not 0 < fraction <= 1:
        raise UsageError(f"--fraction {fraction}: must be above 0 and at most 1",
                         hint="e.g. --fraction 0.1 for a tenth of each class")
    wanted = read_list(list_file) if list_file is not None else None
    sel = walk(src)
    if wanted is not None:
        sel = filter_list(sel, wanted, list_file)
    sel = filter_globs(sel, list(include), list(exclude))
    if fraction is not None:
        sel = sample(sel, fraction, seed)
    return sel
