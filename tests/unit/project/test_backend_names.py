"""Only `backends/` decides by a backend's name: everything else asks the registry for
the backend's facts (`block_cache`, `restores_at_boot`, ...) or names the plain backend
through `backends.PLAIN`, so that adding or renaming a backend touches one module.

Read from the source with ast: a string naming a backend is refused where a decision is
made of it (a comparison, a membership test, an `or` default, a `backend=` argument) in
any module of provision outside backends/. The mapping's schema (records.py, which maps
each recorded backend to the shape of its state) lists them as data, below backends.
"""

from __future__ import annotations

import ast
from pathlib import Path

from hotcache.provision.backends import BACKENDS

PROVISION = Path(__file__).resolve().parents[3] / "provision"
EXEMPT = {PROVISION / "records.py"}


def _names(node: ast.AST) -> list[str]:
    """The backend names a node spells out: a string, or a tuple/list/set of them."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items
            if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value in BACKENDS]


def decisions_by_name(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each backend name compared with, tested against or given as a
    default for something that is a backend (its expression says `backend`), or passed
    as `backend=`. The same words elsewhere (a kernel feature, "none" in a message) are
    not backends."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.BoolOp):
            operands = node.values
        elif isinstance(node, ast.keyword) and node.arg == "backend":
            found += [(node.value.lineno, n) for n in _names(node.value)]
            continue
        else:
            continue
        if any("backend" in ast.unparse(o) for o in operands):
            found += [(node.lineno, n) for o in operands for n in _names(o)]
    return sorted(found)


def test_no_module_outside_backends_decides_by_a_backend_name():
    found = []
    for path in sorted(PROVISION.rglob("*.py")):
        if "backends" in path.relative_to(PROVISION).parts or path in EXEMPT:
            continue
        found += [f"{path.relative_to(PROVISION)}:{line}: {name!r}"
                  for line, name in decisions_by_name(ast.parse(path.read_text()))]
    assert not found, "decided by a backend's name (ask BACKENDS for a fact):\n" + "\n".join(found)


def test_the_check_sees_each_kind_of_decision():
    src = '''
a = entry.backend == "bcache"
b = row["backend"] in ("dm-cache", "x")
c = row.get("backend") or "none"
d = CacheEntry(backend="lvmcache")
e = "bcache" != cache.backend
fine = Path("/sys/block/x") / "bcache"
also_fine = feature == "bcache" or ", ".join(names) or "none"
'''
    assert [n for _, n in decisions_by_name(ast.parse(src))] == [
        "bcache", "dm-cache", "none", "lvmcache", "bcache"]
