"""Read-only probes that fail closed.

A probe that exits non-zero, or prints what cannot be parsed, raises ProbeFailed (exit 4)
naming the command and its stderr. Only the exact answers a tool gives for "nothing
there" (blkid's exit 2 on a readable device, lvm's "not found", dmsetup's "does not
exist") read as absent: a failed blkid must never look like a blank disk.
"""

from __future__ import annotations

import json
import os
from typing import Any, overload

from hotcache.provision.errors import ProbeFailed
from hotcache.provision.system.runner import Result, Runner


@overload
def run(runner: Runner, argv: list[str], *, absent_rc: tuple[()] = (),
        absent_stderr: tuple[str, ...] = ()) -> Result: ...
@overload
def run(runner: Runner, argv: list[str], *, absent_rc: tuple[int, ...],
        absent_stderr: tuple[str, ...] = ()) -> Result | None: ...
def run(runner: Runner, argv: list[str], *, absent_rc: tuple[int, ...] = (),
        absent_stderr: tuple[str, ...] = ()) -> Result | None:
    """The result of a probe that succeeded; None when it answered "nothing there" in
    one of the listed ways (exit code in `absent_rc` and, when given, stderr containing
    one of `absent_stderr`); ProbeFailed otherwise."""
    res = runner.query(argv, check=False)
    if res.returncode == 0:
        return res
    if res.returncode in absent_rc and (
            not absent_stderr or any(s in res.stderr for s in absent_stderr)):
        return None
    raise ProbeFailed(res.argv, res.returncode, res.stderr or res.stdout)


def json_doc(res: Result) -> dict[str, Any]:
    """The JSON a probe printed; ProbeFailed when it is not a JSON object."""
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise ProbeFailed(res.argv, res.returncode, res.stderr,
                          why=f"its output is not the JSON hotcache expects: "
                              f"{res.stdout.strip()[:120]!r}")
    return doc


def readable(node: str | os.PathLike[str]) -> bool:
    """True when `node` can be opened for reading (blkid exits 2 both for "no signature"
    and for "cannot open": only the first may read as blank)."""
    try:
        fd = os.open(node, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True
