"""`hotcache verify`: is the hot copy still exactly what was copied?

fast    every manifest file is there, is a regular file, nothing extra, total bytes match
sample  fast, plus the sha256 of N files picked at random
full    fast, plus the sha256 of every file (in parallel threads)

The result (verified_at, verify_ok) goes into the copy's metadata and the mapping.
"""

from __future__ import annotations

import json
import os
import random
import stat
from collections import deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path

from hotcache.provision.hotcopy import manifest
from hotcache.provision.system import beneath
from hotcache.provision.errors import HotcacheError, UsageError
from hotcache.provision.hotcopy.filecopy import default_jobs
from hotcache.provision.hotcopy.format import (MANIFEST, METADATA, RESERVED, STAGING_SUFFIX,
                                               read_metadata)
from hotcache.provision.system.clock import now
from hotcache.provision.system.chunks import CHUNK, sha256_of
from hotcache.provision.system.meter import NullMeter

WINDOW = 64    # files in flight per thread


def sha256_file(root_fd: int, rel: str, meter: NullMeter, evict: bool = False) -> str:
    """The sha256 of `rel` beneath the folder `root_fd` (no symlink followed anywhere on
    the way). With `evict`, its cached pages are dropped first so the bytes come from the
    device, not from what the page cache remembers of the write."""
    fd = beneath.open_at(root_fd, rel, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a regular file"
        if evict:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return sha256_of(fd, memoryview(bytearray(CHUNK)), meter.advance)
    finally:
        os.close(fd)


def hash_files(root_fd: int, pairs: Iterable[tuple[str, str]], jobs: int,
               meter: NullMeter, evict: bool = False) -> list[dict]:
    """Hash each (path, expected sha256) beneath the folder `root_fd` in parallel threads;
    a problem for each that differs. The pairs are taken a window at a time as the
    threads need them, so a caller may stream millions of them."""
    def check(pair: tuple[str, str]) -> dict | None:
        rel, want = pair
        try:
            got = sha256_file(root_fd, rel, meter, evict)
        except OSError as exc:
            return {"path": rel, "problem": f"cannot be read ({exc.strerror}; a symlink "
                                            "on the way is never followed)"}
        finally:
            meter.file_done()
        if got != want:
            return {"path": rel, "problem": f"sha256 {got} differs from the manifest's "
                                            f"{want}"}
        return None

    jobs = jobs or default_jobs()
    problems: list[dict] = []
    pairs = iter(pairs)
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="hotcache-verify") as pool:
        window: deque = deque(pool.submit(check, p) for p in islice(pairs, WINDOW * jobs))
        while window:   # in order, refilled one for one: at most WINDOW x jobs in flight
            found = window.popleft().result()
            if found:
                problems.append(found)
            for p in islice(pairs, 1):
                window.append(pool.submit(check, p))
    return problems


def _present(root_fd: int) -> dict[str, int]:
    """{rel: size} of every regular file in DEST except hotcache's own (and, on a
    mountpoint, lost+found and an unfinished refresh's staging folder); other kinds
    (symlinks, FIFOs) get size -1 so that they count as wrong."""
    found = {}
    for top, dirs, files, fd in beneath.walk(root_fd):
        if not top:
            dirs[:] = [d for d in dirs if d != "lost+found" and not d.endswith(STAGING_SUFFIX)]
        for name in files + [d for d in dirs
                             if stat.S_ISLNK(os.stat(d, dir_fd=fd, follow_symlinks=False).st_mode)]:
            rel = f"{top}/{name}" if top else name
            if rel in RESERVED:
                continue
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            found[rel] = st.st_size if stat.S_ISREG(st.st_mode) else -1
    return found


def verify(dest: Path, mode: str = "fast", sample: int = 0, jobs: int = 0,
           meter: NullMeter | None = None, state: Path | None = None,
           record: bool = True) -> dict:
    """Check the copy at `dest`; returns a report with `ok` and `problems` (by path)."""
    meter = meter or NullMeter()
    dest = Path(os.path.abspath(dest))
    meta = read_metadata(dest)
    if meta is None:
        raise UsageError(f"{dest} is not a complete hot copy (no valid {METADATA} and "
                         f"{MANIFEST})", hint="make one with `hotcache copy SRC DEST`")
    if mode == "sample" and sample < 1:
        raise UsageError(f"--sample {sample}: give how many files to hash (1 or more)")
    root = beneath.open_root(dest)
    try:
        return _verify(dest, root, meta, mode, sample, jobs, meter, state, record)
    finally:
        os.close(root)


def _verify(dest, root, meta, mode, sample, jobs, meter, state, record) -> dict:
    digests = manifest.read(MANIFEST, dir_fd=root)
    present = _present(root)
    problems: list[dict] = []
    for rel in sorted(set(digests) - set(present)):
        problems.append({"path": rel, "problem": "missing"})
    for rel in sorted(set(present) - set(digests)):
        problems.append({"path": rel, "problem": "not in the manifest"})
    for rel in sorted(r for r in digests if present.get(r) == -1):
        problems.append({"path": rel, "problem": "not a regular file"})
    total = sum(s for s in present.values() if s > 0)
    if len(digests) != meta.get("files"):
        problems.append({"path": MANIFEST, "problem": f"lists {len(digests)} files, the "
                         f"metadata says {meta.get('files')}"})
    if total != meta.get("bytes") and not problems:
        problems.append({"path": ".", "problem": f"holds {total} bytes, the metadata says "
                         f"{meta.get('bytes')} (a file changed size)"})
    checkable = sorted(r for r in digests if present.get(r, -1) >= 0)
    if mode == "full":
        to_hash = checkable
    elif mode == "sample":
        to_hash = sorted(random.SystemRandom().sample(checkable, min(sample, len(checkable))))
    else:
        to_hash = []
    meter.start(f"verify {dest.name} ({mode})", sum(present[r] for r in to_hash),
                len(to_hash))
    problems.extend(hash_files(root, ((r, digests[r]) for r in to_hash), jobs, meter))
    ok = not problems
    report = {"path": str(dest), "name": meta.get("name"), "version": meta.get("version"),
              "mode": mode, "files": len(digests), "bytes": total, "hashed_files": len(to_hash),
              "ok": ok, "problems": problems, "verified_at": now(), "recorded": False}
    if record:
        report["recorded"] = _record(dest, root, meta, report, state)
    return report


def _record(dest: Path, root: int, meta: dict, report: dict, state: Path | None) -> bool:
    """Store the outcome in the metadata (and the mapping); a read-only copy is fine."""
    from hotcache.provision.hotcopy.catalog import record

    # The failed paths let the next `hotcache copy` replace those files even when their
    # size and mtime still look right (bit rot, a write that kept the mtime).
    meta = {**meta, "verified_at": report["verified_at"], "verify_ok": report["ok"],
            "verify_mode": report["mode"],
            "verify_failed": [p["path"] for p in report["problems"]]}
    try:   # replaced beneath DEST's descriptor, owner and mode set on the new file's fd
        st = os.stat(METADATA, dir_fd=root, follow_symlinks=False)
        beneath.write_file(root, METADATA, (json.dumps(meta, indent=2) + "\n").encode(),
                           beneath.strip_privilege(st.st_mode),
                           (st.st_uid, st.st_gid) if os.geteuid() == 0 else None)
    except PermissionError:
        return False
    try:
        record(dest, meta, state)
    except (HotcacheError, OSError):
        pass  # the copy's own metadata holds the result; the mapping is a convenience
    return True
