"""An import inside a function says why it is there. Most save start-up time (a command
that never needs torch, pydantic's spec models or typer does not load them), a few
break what would be a cycle; either way the next reader needs the reason on the import
or on the lines just above it, or moves the import to the top of the module."""

from __future__ import annotations

import ast
import textwrap

from tests.unit.project.test_import_direction import PACKAGES

NEAR = 3    # lines above an import where its reason may stand


def unexplained(source: str, name: str) -> list[str]:
    """`name:line: import` for each function-local import with no comment on its line or
    on the NEAR lines above it."""
    lines = source.splitlines()
    out = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            first = node.lineno - 1
            near = lines[max(0, first - NEAR):node.end_lineno]
            if not any("#" in line for line in near):
                out.append(f"{name}:{node.lineno}: {lines[first].strip()}")
    return sorted(set(out))


def test_every_function_local_import_gives_its_reason():
    found = []
    for folder in PACKAGES.values():
        for path in sorted(folder.rglob("*.py")):
            found += unexplained(path.read_text(), str(path.relative_to(folder.parent)))
    assert found == [], "say why each of these is imported in a function, or move it " \
        "to the top of its module:\n" + "\n".join(found)


def test_the_checker_sees_an_import_without_its_reason():
    source = textwrap.dedent("""\
        def explained():
            # start-up: torch only for this command
            import torch

        def shared_reason():
            # start-up: only where asked
            import socket

            from x import y

        def unexplained():
            x = 1
            y = 2
            z = 3
            import json
    """)
    assert unexplained(source, "m.py") == ["m.py:15: import json"]
