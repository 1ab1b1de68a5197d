"""The staging folder of a hot copy: where a copy is built before it is published. It
lies next to DEST (`.{DEST.name}.hotcache-staging`), or inside DEST when DEST is a
mountpoint, so that it is always on DEST's own filesystem. It is locked while a copy uses
it, carries a header naming its source and DEST, and a journal of the files known to be on stable
storage, so that a run killed at any point can resume.

The folder is hotcache's or it is refused. It is made with mkdir (never reused blindly)
as a real folder owned by the effective user, mode 0700, so nobody else can enter it;
a folder already at that name is reused only when lstat and fstat show exactly that,
otherwise the copy is refused naming its owner. Everything inside is reached through
the folder's descriptor (system/beneath.py), so renaming the folder away or planting a
symlink at its name redirects nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import stat
from typing import TextIO
from pathlib import Path

from hotcache.provision.errors import RefusedError
from hotcache.provision.hotcopy.format import staging_dir
from hotcache.provision.system import beneath

HEADER = ".hotcache-staging.json"   # which source and DEST this staging folder belongs to
HEADER_LIMIT = 2**16
JOURNAL = ".hotcache-journal"       # one JSON line per finished file: rel, size, mtime, sha
MODE = 0o700


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def made_here(folder: Path, st: os.stat_result) -> bool:
    """True when `folder` (the folder `st` describes, opened without following a link and
    checked to be that inode) holds the header hotcache wrote into a staging folder it
    made at exactly this path: the DEST named there puts its staging folder here (next
    to DEST, or inside DEST when DEST is a mountpoint). A folder someone renamed to a
    staging name, or hotcache's own staging folder moved from another DEST, is not."""
    try:
        fd = os.open(folder, beneath.DIR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:   # never through a symlink, a FIFO or a huge file planted at the header's name
        beneath.expect(fd, st, str(folder))
        dest = json.loads(beneath.read_file(fd, HEADER, limit=HEADER_LIMIT))["dest"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    finally:
        os.close(fd)
    if not isinstance(dest, str) or not os.path.isabs(dest):
        return False
    here = staging_dir(Path(dest))
    return folder in (here, Path(dest) / here.name)


class Staging:
    """`parent_fd` is the folder holding the staging folder (DEST's parent, or DEST itself
    when DEST is a mountpoint); `name` is the staging folder's name in it."""

    def __init__(self, path: Path, parent_fd: int):
        self.path = path
        self.name = path.name
        self.parent_fd = parent_fd
        self._fd: int | None = None
        self._st: os.stat_result | None = None
        self._journal: TextIO | None = None

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    @property
    def fd(self) -> int:
        """The staging folder's descriptor (after `open` or `create`)."""
        return beneath.held(self._fd, f"{self.path}: the staging folder is not open")

    @property
    def st(self) -> os.stat_result:
        """The staging folder as hotcache opened it."""
        return beneath.held(self._st, f"{self.path}: the staging folder is not open")

    # ------------------------------------------------------------ ours or refused
    def exists(self) -> bool:
        return beneath.lstat_at(self.parent_fd, self.name) is not None

    def _refuse(self, st: os.stat_result, why: str) -> None:
        raise RefusedError(
            f"{self.path} is not a staging folder hotcache made: {why} (owner "
            f"{_user(st.st_uid)}, mode {stat.filemode(st.st_mode)}); hotcache neither "
            "reuses nor deletes it",
            hint=f"look at what it holds, remove it yourself (rm -r {self.path}), and "
                 "run the copy again")

    def open(self) -> bool:
        """Open and lock an existing staging folder after checking it is ours; False when
        there is none."""
        st = beneath.lstat_at(self.parent_fd, self.name)
        if st is None:
            return False
        if not stat.S_ISDIR(st.st_mode):
            self._refuse(st, "it is not a folder")
        if st.st_uid != os.geteuid():
            self._refuse(st, "another user owns it")
        if stat.S_IMODE(st.st_mode) != MODE:
            self._refuse(st, "its mode is not 0700")
        fd = beneath.open_at(self.parent_fd, self.name, beneath.DIR)
        try:
            beneath.expect(fd, st, str(self.path))
        except OSError:
            os.close(fd)
            raise RefusedError(f"{self.path} was replaced while hotcache looked at it",
                               hint="make sure nobody else writes there; run again") from None
        self._fd, self._st = fd, st
        self.lock()
        return True

    def create(self, src: Path, dest: Path) -> None:
        """A new staging folder (mkdir; a folder already there is opened by `open`)."""
        if self._fd is None:
            os.mkdir(self.name, MODE, dir_fd=self.parent_fd)
            fd = beneath.open_at(self.parent_fd, self.name, beneath.DIR)
            # Between mkdir and open, a user who can write to the parent can rename the
            # new folder away and put their own in its place: it is adopted only if it
            # is the folder just made (root's, empty), never chowned as found.
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or os.listdir(fd):
                os.close(fd)
                self._refuse(st, "it was replaced right after hotcache made it"
                             if st.st_uid != os.geteuid() else
                             "something was put in it right after hotcache made it")
            # the parent may be setgid (group-shared mounts are): take the folder back
            os.fchown(fd, os.geteuid(), os.getegid())
            os.fchmod(fd, MODE)
            self._fd, self._st = fd, os.fstat(fd)
            self.lock()
        header = {"source": os.fsdecode(src), "dest": os.fsdecode(dest)}
        beneath.write_file(self.fd, HEADER, json.dumps(header).encode(), 0o600)

    def lock(self) -> None:
        """Hold an flock on the folder itself: a second copy to the same DEST is refused."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise RefusedError(f"another hotcache copy is writing {self.path}",
                               hint="wait for it to finish") from None

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    unlock = close

    # ------------------------------------------------------------ header and journal
    def source(self) -> str | None:
        try:
            # the header `create` wrote: its "source" is a str
            source: str | None = json.loads(beneath.read_file(self.fd, HEADER)).get("source")
        except (OSError, ValueError, AttributeError):
            return None
        return source

    def journaled(self) -> dict[str, tuple[int, int, str]]:
        """{rel: (size, mtime_ns, sha256)} of the files an earlier run finished."""
        done: dict[str, tuple[int, int, str]] = {}
        try:
            text = beneath.read_file(self.fd, JOURNAL).decode()
        except FileNotFoundError:
            return done
        for line in text.splitlines():
            try:
                rel, size, mtime_ns, digest = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill: that file is simply copied again
            done[rel] = (size, mtime_ns, digest)
        return done

    def prune(self, keep: set[str]) -> None:
        """Remove what an earlier run left that is neither journaled nor wanted now."""
        for top, dirs, files, fd in beneath.walk(self.fd, topdown=False):
            for name in files:
                rel = f"{top}/{name}" if top else name
                if rel not in keep and rel not in (HEADER, JOURNAL):
                    os.unlink(name, dir_fd=fd)
            for name in dirs:
                try:
                    os.rmdir(name, dir_fd=fd)
                except OSError:
                    pass   # not empty: it holds journaled files

    def append(self, done: list[tuple[str, int, int, str]]) -> None:
        """Journal files whose data the caller has already made durable (syncfs).
        json.dumps writes a non-UTF-8 name as \\udcXX escapes: the journal stays ASCII."""
        if self._journal is None:
            fd = beneath.open_at(self.fd, JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            self._journal = os.fdopen(fd, "a")
        self._journal.write("".join(json.dumps(list(d)) + "\n" for d in done))
        self._journal.flush()

    def forget(self, rels: set[str]) -> None:
        """Drop files from the staging folder and its journal (they read back wrong)."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        keep = {r: v for r, v in self.journaled().items() if r not in rels}
        beneath.write_file(self.fd, JOURNAL, "".join(
            json.dumps([r, *v]) + "\n" for r, v in keep.items()).encode(), 0o600)
        for rel in rels:
            folder, _, name = rel.rpartition("/")
            fd = beneath.open_at(self.fd, folder or ".", beneath.DIR)
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)

    def seal(self) -> None:
        """The copy is complete: drop the bookkeeping before the folder becomes DEST.
        The manifest is written before this, so a failure there leaves the journal."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        for name in (HEADER, JOURNAL):
            try:
                os.unlink(name, dir_fd=self.fd)
            except FileNotFoundError:
                pass

    def remove(self) -> None:
        """Delete the staging folder: its contents through its descriptor, then the name,
        only while the name still is this folder."""
        if self._fd is None and not self.open():
            return
        try:
            beneath.empty(self.fd)
            beneath.rmdir_if(self.parent_fd, self.name, self.st)
        finally:
            self.close()
