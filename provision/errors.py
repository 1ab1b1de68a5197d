"""Every error hotcache reports, and the one table that maps them to exit codes.

Code raises a subclass of HotcacheError with a message that names the input and says what
to do next; the CLI prints the message and exits with the class's code. Nothing else in
the code base chooses an exit code.
"""

from __future__ import annotations

import errno
import shlex
from typing import Any


class ExitCode:
    OK = 0
    FAILED = 1          # a step or check failed for a reason not listed below
    BAD_INPUT = 2       # the spec, an option or an argument is wrong; nothing was changed
    REFUSED = 3         # a safety check refused a destructive or unsafe step
    COMMAND_FAILED = 4  # an external program exited non-zero
    DRIFT = 5           # status/verify: what is there differs from what should be
    NOT_ROOT = 6        # the command needs root
    MISSING_TOOL = 7    # a program or kernel feature this host lacks
    TIMEOUT = 8         # a bounded wait (flush, device to appear) ran out
    UNHEALTHY = 9       # doctor: the host has problems (each printed with its fix)
    OS_ERROR = 10       # the operating system refused a call (permission, full disk, I/O)
    INTERRUPTED = 130   # Ctrl-C (SIGINT): 128 + the signal's number, as a shell reports it
    TERMINATED = 143    # SIGTERM (systemd stopping a unit, a timeout): 128 + 15


class HotcacheError(Exception):
    """Base class: `str(err)` is the message for the user, `exit_code` the status."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  next: {self.hint}"

    def to_json(self) -> dict[str, Any]:
        return {
            "error": type(self).__name__,
            "message": self.message,
            "hint": self.hint,
            "exit_code": self.exit_code,
        }


class Interrupted(BaseException):
    """Ctrl-C (SIGINT) or SIGTERM arrived while a command ran: raised in the main thread by
    the handler the CLI installs (cli/app.py). A BaseException, as KeyboardInterrupt is, so
    that no `except Exception` swallows it and every `finally` and `except BaseException`
    on the way out runs (a copy journals what it finished and leaves its staging folder
    to resume); not a KeyboardInterrupt, which typer turns into a silent exit before the
    CLI can say what happened. Reported like a HotcacheError."""

    CODES = {"SIGINT": ExitCode.INTERRUPTED, "SIGTERM": ExitCode.TERMINATED}
    message = "interrupted; run the same command again to finish"
    hint = None

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.exit_code = self.CODES.get(signal_name, ExitCode.FAILED)

    def __str__(self) -> str:
        return self.message

    def to_json(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint,
                "exit_code": self.exit_code, "signal": self.signal_name}


class SpecError(HotcacheError):
    """The host spec (or an option) is invalid. `problems` lists 'yaml.path: what' lines;
    `locations` the (line, column) in the file of each, where it is known, shown as
    `file:line:col:` before it."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, source: str, problems: list[str], *, hint: str | None = None,
                 locations: list[tuple[int, int] | None] | None = None):
        self.source = source
        self.problems = problems
        self.locations = list(locations or [None] * len(problems))
        lines = "\n".join(f"  {source}:{at[0]}:{at[1]}: {p}" if at else f"  {p}"
                          for p, at in zip(problems, self.locations))
        many = f" ({len(problems)} problems)" if len(problems) > 1 else ""
        super().__init__(f"{source}: invalid host spec{many}\n{lines}", hint=hint)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "problems": self.problems,
                "locations": [{"line": at[0], "column": at[1]} if at else None
                              for at in self.locations]}


class UsageError(HotcacheError):
    exit_code = ExitCode.BAD_INPUT


class RefusedError(HotcacheError):
    """A safety check said no: unsafe device, busy mount, dirty cache, missing --yes."""

    exit_code = ExitCode.REFUSED


class CommandFailed(HotcacheError):
    exit_code = ExitCode.COMMAND_FAILED

    def __init__(self, argv: list[str], returncode: int, stderr: str):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        detail = self.stderr.splitlines()[-1] if self.stderr else "(no output)"
        super().__init__(f"`{shlex.join(self.argv)}` exited {returncode}: {detail}")

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "argv": self.argv, "returncode": self.returncode,
                "stderr": self.stderr}


class MissingProgram(HotcacheError):
    exit_code = ExitCode.MISSING_TOOL

    def __init__(self, program: str, package: str | None):
        self.program = program
        self.package = package
        hint = f"apt-get install {package}" if package else "install it and retry"
        super().__init__(f"program `{program}` is not installed", hint=hint)


class KernelUnsupported(HotcacheError):
    exit_code = ExitCode.MISSING_TOOL


class NotRoot(HotcacheError):
    exit_code = ExitCode.NOT_ROOT

    def __init__(self, command: str, why: str = "changes block devices and mounts",
                 hint: str | None = None):
        super().__init__(f"`hotcache {command}` {why}, so it must run as root",
                         hint=hint or f"sudo hotcache {command} ...")


class OsFailure(HotcacheError):
    """An operating-system call failed where no more particular error was raised: a
    file that cannot be read or written, a full or read-only filesystem, an I/O error.
    `from_os_error` turns the OSError into a message that names the path and the fix."""

    exit_code = ExitCode.OS_ERROR

    def __init__(self, message: str, *, hint: str | None = None, errno_name: str | None = None,
                 path: str | None = None):
        super().__init__(message, hint=hint)
        self.errno_name, self.path = errno_name, path

    @classmethod
    def from_os_error(cls, exc: OSError) -> "OsFailure":
        name = errno.errorcode.get(exc.errno or 0)
        paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
        what = exc.strerror or str(exc)
        hints = {
            "EACCES": "run it as root, or give this user access to the path",
            "EPERM": "run it as root, or give this user access to the path",
            "ENOSPC": "free space on that filesystem (`hotcache prune`) and run it again",
            "EDQUOT": "free space on that filesystem (`hotcache prune`) and run it again",
            "EROFS": "the filesystem is mounted read-only: remount it read-write or pick "
                     "another path",
            "EIO": "the device returned an I/O error: check `dmesg` and `hotcache doctor`",
            "ENOENT": "check the path and run it again",
            "EEXIST": "something is in the way of that path: move it or pick another path",
            "ENOTDIR": "something is in the way of that path: move it or pick another path",
        }
        what = f"{what} ({name})" if name else what
        return cls(f"{what}: {' -> '.join(paths)}" if paths else what,
                   hint=hints.get(name or "", "fix the cause and run the same command again"),
                   errno_name=name, path=paths[0] if paths else None)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "errno": self.errno_name, "path": self.path}


class DriftError(HotcacheError):
    exit_code = ExitCode.DRIFT


class WaitTimeout(HotcacheError):
    exit_code = ExitCode.TIMEOUT


class LockTimeout(WaitTimeout):
    """Another hotcache run held the mapping's lock for longer than we were told to wait."""


class FlushIncomplete(HotcacheError):
    """A cache stopped being live (failing origin, stopped device) before its dirty data
    was written back: teardown stops and keeps the cache, its entry and its unit."""

    exit_code = ExitCode.FAILED


class ProbeFailed(CommandFailed):
    """A read-only probe (blkid, wipefs, lsblk, dmsetup, lvs) failed or printed what
    hotcache cannot parse. Never read as "blank" or "absent": that is how data is lost."""

    def __init__(self, argv: list[str], returncode: int, stderr: str, why: str | None = None):
        super().__init__(argv, returncode, stderr)
        detail = why or (self.stderr.splitlines()[-1] if self.stderr else "(no output)")
        HotcacheError.__init__(
            self, f"probe `{shlex.join(self.argv)}` failed (exit {returncode}): {detail}; hotcache "
                  "does not touch a device it cannot read",
            hint="run that command by hand to see why, fix it, and retry")
