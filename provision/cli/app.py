"""The `hotcache` typer app: every command module registers its commands on it the same
way (`register(app)`), and main() maps errors to exit codes (errors.py)."""

from __future__ import annotations

import sys

import typer
from typer.exceptions import TyperException

from hotcache.provision.cli import cache, commands, copies, kube, observe, slurm
from hotcache.provision.cli.common import emit
from hotcache.provision.errors import ExitCode, HotcacheError, OsFailure, UsageError

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
        from hotcache.provision import __version__

        sys.stdout.write(f"hotcache {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """hotcache: SSD caches, hot copies and input-bound diagnostics for GPU hosts."""


for _module in (commands, copies, cache, observe, kube, slurm):
    _module.register(app)


def fail(err: HotcacheError) -> None:
    """Report an error the one way: its message (and next step) on stderr, under --json
    also a document of kind "error" on stdout, and its exit code from errors.ExitCode."""
    if "--json" in sys.argv:
        emit(err.to_json(), "error")
    sys.stderr.write(f"hotcache: {err}\n")
    sys.exit(err.exit_code)


def main() -> None:
    try:
        rc = app(standalone_mode=False, prog_name="hotcache")
    except HotcacheError as err:
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
    except KeyboardInterrupt:
        sys.stderr.write("hotcache: interrupted; run the same command again to finish\n")
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)
