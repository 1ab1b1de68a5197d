"""The `hotcache` typer app: every command module registers its commands on it the same
way (`register(app)`), and main() maps errors to exit codes (errors.py)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

import typer
from typer.exceptions import TyperException

from hotcache.provision import __version__
from hotcache.provision.cli import cache, commands, copies, failover, kube, observe, slurm
from hotcache.provision.cli.common import emit
from hotcache.provision.errors import (ExitCode, HotcacheError, Interrupted, OsFailure,
                                      UsageError)

HELP = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    help="SSD caches in front of HDD arrays, verified hot copies of datasets, and the "
         "numbers that tell whether training waits for data.\n\n"
         "Typical flow: `hotcache devices` to see the disks, write a host spec (see "
         "examples/), `hotcache plan SPEC`, `hotcache apply SPEC`, `hotcache status`.",
    no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
    rich_markup_mode=None, context_settings=HELP,
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"hotcache {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """hotcache: SSD caches, hot copies and input-bound diagnostics for GPU hosts."""


for _module in (commands, copies, cache, failover, observe, kube, slurm):
    _module.register(app)


def fail(err: HotcacheError | Interrupted) -> None:
    """Report an error the one way: its message (and next step) on stderr, under --json
    also a document of kind "error" on stdout, and its exit code from errors.ExitCode."""
    if "--json" in sys.argv:
        emit(err.to_json(), "error")
    sys.stderr.write(f"hotcache: {err}\n")
    sys.exit(err.exit_code)


def _stop(signum: int, frame: object) -> None:
    """SIGINT or SIGTERM: stop the command where the main thread is, cleanly (see
    errors.Interrupted). A second one while it cleans up kills the process at once."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Interrupted(signal.Signals(signum).name)


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """Ctrl-C and SIGTERM (systemd stopping a unit, Ansible's or timeout(1)'s limit) end a
    command as one error: the line on stderr, the --json document, 130 or 143. A signal
    that was ignored when hotcache started (`cmd &` in a script) stays ignored; the
    handlers that were there before come back afterwards (main() run by a test)."""
    if threading.current_thread() is not threading.main_thread():
        yield       # signals reach the main thread only
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    if before[signal.SIGINT] is signal.default_int_handler:
        signal.signal(signal.SIGINT, _stop)
    if before[signal.SIGTERM] == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def main() -> None:
    with stopping_on_signals():
        _main()


def _main() -> None:
    try:
        rc = app(standalone_mode=False, prog_name="hotcache")
    except (HotcacheError, Interrupted) as err:
        fail(err)
    except OSError as exc:      # not foreseen where it happened: no traceback, the fix
        fail(OsFailure.from_os_error(exc))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.stderr.write("hotcache: aborted\n")
        sys.exit(ExitCode.REFUSED)
    except TyperException as exc:  # usage errors: unknown option, missing argument
        if "--json" in sys.argv:
            emit(UsageError(exc.format_message()).to_json(), "error")
        show = getattr(exc, "show", None)   # typer's click errors print usage and the error
        if show is not None:
            show()
        else:
            sys.stderr.write(f"Error: {exc.format_message()}\n")
        sys.exit(ExitCode.BAD_INPUT)
    except KeyboardInterrupt:     # Ctrl-C where SIGINT was Python's own (not main's)
        fail(Interrupted("SIGINT"))
    sys.exit(rc if isinstance(rc, int) else 0)
