"""`hotcache slurm task-prolog` without typer: Slurm runs it before every task of every
job, as the job's user, so it loads only what it uses (the verified-copies index, the
mount table, a copy's metadata). Anything but the plain options (`--help`, a typo) goes
to the full command line, which explains itself."""

from __future__ import annotations

import os
import sys

from hotcache.provision.observe.slurm import run_task_prolog


def options(args: list[str]) -> dict[str, str] | None:
    """--state/--fstab, as `--state X` or `--state=X`; None for anything else."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name not in ("--state", "--fstab"):
            return None
        if not eq:
            if i + 1 >= len(args):
                return None
            i += 1
            value = args[i]
        out[name[2:]] = value
        i += 1
    return out


def fast(args: list[str]) -> int | None:
    """Print the TaskProlog's lines; None when the arguments need the full parser."""
    opts = options(args)
    if opts is None:
        return None
    sys.stdout.write("".join(line + "\n" for line in run_task_prolog(opts.get("state"),
                                                                    dict(os.environ))))
    sys.stdout.flush()
    return 0
