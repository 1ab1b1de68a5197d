"""The staging folder of a hot copy (`.{DEST.name}.hotcache-staging`, next to DEST): where
a copy is built before it is published. It is locked while a copy uses it, carries a
header naming its source, and a journal of the files known to be on stable storage, so
that a run killed at any point can resume."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

from hotcache.provision.system.atomic import write_atomic
from hotcache.provision.errors import RefusedError
from hotcache.provision.hotcopy.format import staging_dir

HEADER = ".hotcache-staging.json"   # which source this staging folder belongs to
JOURNAL = ".hotcache-journal"       # one JSON line per finished file: rel, size, mtime, sha


class Staging:
    def __init__(self, dest: Path):
        self.path = staging_dir(dest)
        self._fd: int | None = None
        self._journal = None

    def lock(self) -> None:
        """Hold an flock on the folder itself: a second copy to the same DEST is refused."""
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise RefusedError(f"another hotcache copy is writing {self.path}",
                               hint="wait for it to finish") from None

    def unlock(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def source(self) -> str | None:
        try:
            return json.loads((self.path / HEADER).read_text()).get("source")
        except (OSError, ValueError, AttributeError):
            return None

    def journaled(self) -> dict[str, tuple[int, int, str]]:
        """{rel: (size, mtime_ns, sha256)} of the files an earlier run finished."""
        done = {}
        try:
            text = (self.path / JOURNAL).read_text()
        except FileNotFoundError:
            return done
        for line in text.splitlines():
            try:
                rel, size, mtime_ns, digest = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill: that file is simply copied again
            done[rel] = (size, mtime_ns, digest)
        return done

    def create(self, src: Path) -> None:
        self.path.mkdir(mode=0o700, exist_ok=True)
        self.lock()
        write_atomic(self.path / HEADER, json.dumps({"source": str(src)}))

    def prune(self, keep: set[str]) -> None:
        """Remove what an earlier run left that is neither journaled nor wanted now."""
        for dirpath, _dirnames, filenames in os.walk(self.path, topdown=False):
            top = Path(dirpath)
            for name in filenames:
                rel = (top / name).relative_to(self.path).as_posix()
                if rel not in keep and rel not in (HEADER, JOURNAL):
                    os.unlink(top / name)
            if top != self.path and not any(top.iterdir()):
                top.rmdir()

    def append(self, done: list[tuple[str, int, int, str]]) -> None:
        """Journal files whose data the caller has already made durable (syncfs)."""
        if self._journal is None:
            self._journal = open(self.path / JOURNAL, "a")
        self._journal.write("".join(json.dumps(list(d)) + "\n" for d in done))
        self._journal.flush()

    def forget(self, rels: set[str]) -> None:
        """Drop files from the staging folder and its journal (they read back wrong)."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        keep = {r: v for r, v in self.journaled().items() if r not in rels}
        write_atomic(self.path / JOURNAL,
                     "".join(json.dumps([r, *v]) + "\n" for r, v in keep.items()))
        for rel in rels:
            (self.path / rel).unlink(missing_ok=True)

    def seal(self) -> None:
        """The copy is complete: drop the bookkeeping before the folder becomes DEST."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        (self.path / HEADER).unlink(missing_ok=True)
        (self.path / JOURNAL).unlink(missing_ok=True)

    def remove(self) -> None:
        self.unlock()
        shutil.rmtree(self.path, ignore_errors=True)
