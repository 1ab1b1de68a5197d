"""What hotcache writes into the systemd units that run as root at every boot (the restore
units of `apply`, the metrics timer): a `hotcache` that only root can change, and
arguments written by systemd's own quoting rules.

A program is trusted when every component of its path, of the path its symlinks lead to,
of its `#!` interpreter and of the folder holding hotcache's code is owned by root and
writable by neither group nor others (a root-owned sticky folder such as /tmp is fine:
others cannot move or remove root's names in it): otherwise whoever can write there owns
the next boot. Arguments are quoted as systemd.service(5) "Command lines" reads them back.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from hotcache.provision.errors import RefusedError, UsageError
from hotcache.provision.system.atomic import write_atomic

_PLAIN = re.compile(r"[A-Za-z0-9_./:=+,@-]+")


def quote(arg: str) -> str:
    """One ExecStart argument: as it is when made of plain characters, else in double
    quotes with backslash and quote escaped; `%` (a specifier) and `$` (a variable) are
    doubled either way. Control characters (a newline would end the line) are refused."""
    if not arg or any(ord(c) < 32 or ord(c) == 127 for c in arg) or arg == ";":
        raise UsageError(f"{arg!r} cannot be written into a systemd unit (empty, ';' or a "
                         "control character)", hint="use a path without such characters")
    text = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(arg):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def command(program: str, *args: str) -> str:
    """An ExecStart= value: the (absolute) program and its arguments, each quoted."""
    if not program.startswith("/"):
        raise UsageError(f"{program!r}: a unit's program must be an absolute path")
    return " ".join(quote(a) for a in (program, *args))


def _who(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _components(path: Path) -> Iterator[Path]:
    cur = Path("/")
    yield cur
    for part in path.parts[1:]:
        cur = cur / part
        yield cur


def not_root_only(path: str | os.PathLike[str]) -> list[str]:
    """Why `path` is not safe to run as root: each component (of the path as written
    and of where its symlinks lead) owned by someone else or writable by group/others."""
    problems = []
    seen = set()
    for p in (Path(os.path.abspath(path)), Path(os.path.realpath(path))):
        for c in _components(p):
            if c in seen:
                continue
            seen.add(c)
            try:
                st = os.lstat(c)
            except OSError as exc:
                problems.append(f"{c}: {exc.strerror}")
                break
            if st.st_uid != 0:
                problems.append(f"{c} is owned by {_who(st.st_uid)}")
            elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
                pass   # sticky (/tmp): others may add names, never move or remove root's
            elif not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
                problems.append(f"{c} is writable by {'group' if st.st_mode & 0o020 else 'others'}"
                                f" (mode {stat.filemode(st.st_mode)})")
    return problems


def interpreter(program: Path) -> str | None:
    """The `#!` interpreter of a script, or None for a binary."""
    try:
        with open(program, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].split()
    return os.fsdecode(words[0]) if words else None


def trusted_program(program: str | os.PathLike[str], code: str | os.PathLike[str]) -> str:
    """`program` when it, its interpreter and `code` (the folder holding hotcache's
    modules) can be changed by root alone; else RefusedError naming each problem and the
    fix."""
    program = Path(os.path.abspath(program))
    if not program.is_file():
        raise RefusedError(f"{program}: no hotcache program there for the boot unit to run",
                           hint="install hotcache as root into a root-owned place (e.g. "
                                "python3 -m venv /opt/hotcache && /opt/hotcache/bin/pip "
                                "install hotcache) and run apply with that hotcache")
    checked = [program, code]
    interp = interpreter(program)
    if interp:
        checked.append(interp)
    problems = [p for path in checked for p in not_root_only(path)]
    if problems:
        shown = "\n  ".join(dict.fromkeys(problems))
        raise RefusedError(
            f"the boot unit would run {program} as root at every boot, but others can "
            f"change what it runs:\n  {shown}",
            hint="install hotcache where only root can write (e.g. /usr/bin/python3 -m venv "
                 "/opt/hotcache && /opt/hotcache/bin/pip install CHECKOUT-OR-WHEEL, as root) "
                 "and run "
                 "apply with /opt/hotcache/bin/hotcache; or make each path above owned by "
                 "root and not group/other-writable (chown root:root, chmod go-w)")
    return str(program)


def is_installed(unit: Path, text: str, wants: Path) -> bool:
    """`unit` holds exactly `text` and is enabled (its link in a target's .wants)."""
    try:
        current = unit.read_text()
    except FileNotFoundError:
        return False
    return current == text and wants.is_symlink()


def install(unit: Path, text: str, wants: Path) -> None:
    """Write `unit` (atomically, mode 0644) and enable it with its `.wants` link."""
    write_atomic(unit, text, 0o644)
    wants.parent.mkdir(parents=True, exist_ok=True)
    if not wants.is_symlink():
        wants.symlink_to(unit)
