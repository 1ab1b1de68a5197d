"""CI installs the `vm` extra first and starts the guest-kernel tier on it, while the rest
installs (.ci/run). So everything the guest tier imports, on the host and in the guests,
its own modules and every hotcache module they reach (imports inside functions too),
must come with hotcache's dependencies and that extra: an import of a package only the
`dev` extra brings would work or fail depending on how far the second install got."""

from __future__ import annotations

import ast
import importlib.metadata as md
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.unit.project.test_import_direction import PACKAGES

ROOT = Path(__file__).resolve().parents[3]
VM_TESTS = ROOT / "tests" / "vm"


def installed_by(extra: str) -> set[str]:
    """The distributions `pip install hotcache[extra]` brings, read from the installed
    metadata: hotcache's requirements for that extra, then theirs, and so on."""
    env = default_environment()
    todo, seen, names = [("hotcache", frozenset({extra}))], set(), set()
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        names.add(canonicalize_name(name))
        for line in md.distribution(name).requires or []:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({**env, "extra": e})
                                      for e in extras | {""}):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return names


def guarded(node: ast.AST) -> bool:
    """Code that never imports, or imports only what may be absent: under `if
    TYPE_CHECKING:`, under `if "torch" in sys.modules:` (the framework the caller
    already loaded), or in a `try:` that catches ImportError."""
    if isinstance(node, ast.If):
        test = ast.unparse(node.test)
        return "TYPE_CHECKING" in test or "sys.modules" in test
    if isinstance(node, ast.Try):
        caught = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
        return bool(caught & {"ImportError", "ModuleNotFoundError"})
    return False


def runtime_imports(tree: ast.AST, package: str | None) -> set[str]:
    """Absolute names of what a module imports at run time, but what `guarded` says
    may be absent; `package`: the module's package, for relative imports."""
    skip = {id(n) for node in ast.walk(tree) if guarded(node)
            for stmt in node.body for n in ast.walk(stmt)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = (package or "").split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def hotcache_file(module: str) -> Path | None:
    for pkg, folder in PACKAGES.items():
        if module == pkg or module.startswith(pkg + "."):
            rel = module[len(pkg):].lstrip(".").replace(".", "/")
            for path in (folder / rel / "__init__.py", folder / f"{rel}.py"):
                if path.is_file():
                    return path
    return None


def third_party_reached() -> dict[str, str]:
    """Top-level third-party module -> a file of the guest tier's reach importing it."""
    local = {p.stem for p in VM_TESTS.rglob("*.py")}
    files = [(p, None) for p in VM_TESTS.rglob("*.py")]
    done, found = set(), {}
    while files:
        path, package = files.pop()
        if path in done:
            continue
        done.add(path)
        for name in runtime_imports(ast.parse(path.read_text()), package):
            top = name.split(".")[0]
            if top == "hotcache":
                target = hotcache_file(name)
                if target is not None:
                    files.append((target, name if target.name == "__init__.py"
                                   else name.rsplit(".", 1)[0]))
            elif top and top not in sys.stdlib_module_names and top not in local:
                found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_the_vm_extra_installs_everything_the_guest_tier_imports():
    provided = installed_by("vm")
    module_dists = md.packages_distributions()
    missing = {top: where for top, where in third_party_reached().items()
               if not {canonicalize_name(d) for d in module_dists.get(top, [])} & provided}
    assert missing == {}, "imported by the guest tier but not installed by hotcache[vm] " \
        "(pyproject.toml): " + ", ".join(f"{m} ({w})" for m, w in sorted(missing.items()))


def test_the_reach_follows_hotcache_down_to_a_third_party_import():
    reached = third_party_reached()
    # typer: the guests run the CLI in process; pyudev: hotcache's Host, several layers down
    assert {"pytest", "yaml", "typer", "pyudev", "pydantic"} <= set(reached), reached
    assert "virtme_ng" not in reached        # a program the host runs, not an import


def test_a_dev_only_package_is_not_in_the_vm_extra():
    provided = installed_by("vm")
    assert {"pytest", "virtme-ng", "pydantic", "typer", "pyyaml"} <= provided
    assert not {"numpy", "torch", "jsonschema", "ansible-core"} & provided
