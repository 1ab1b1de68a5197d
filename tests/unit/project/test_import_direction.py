"""Imports run one way (ARCHITECTURE.md), read from the source with ast: every import,
at the top of a module or inside a function, counts.

    cli -> observe -> engine -> tend -> hotcopy -> backends -> plan, mapping, records -> block -> system
    errors.py is a leaf; adapters import only hotcopy/format.py, system/mountinfo.py and
    errors.py of provision; provision never imports adapters.

observe (reports and exporters: status's views, metrics, labels, Slurm) reads what the
engine builds and knows; the engine never imports observe, and hotcopy neither of them.
tend (what hotcache does to running caches on its own: warm, fail-over) acts through the
backends and the hot copies' catalog, and needs neither the engine nor observe.
Within one layer a module may import another of the same layer; no cycle may form.
Imports under `if TYPE_CHECKING:` count too: an annotation that reaches up ties the
lower layer to the upper one as surely as a runtime import.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = {"hotcache.provision": ROOT / "provision", "hotcache.adapters": ROOT / "adapters"}

# Lower number = lower layer. A module may import its own layer or any lower one.
LAYERS = {
    "errors": 0, "system": 1, "block": 2, "plan": 3, "mapping": 3, "records": 3, "backends": 4,
    "hotcopy": 5, "tend": 6, "engine": 7, "observe": 8, "cli": 9,
}
# What the adapters may use of provision: standard-library modules only.
ADAPTER_MAY_IMPORT = {"hotcache.provision", "hotcache.provision.errors",
                      "hotcache.provision.hotcopy.format", "hotcache.provision.system.mountinfo"}


def modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The hotcache modules `name` imports (a `from pkg import sub` names the submodule)."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".")[: len(name.split(".")) - node.level + is_pkg]
                base = ".".join([*parent, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m.startswith("hotcache.")}


def layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["hotcache", "provision"] or len(parts) < 3:
        return None
    return LAYERS.get(parts[2])


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(m, p, known) & known for m, p in mods.items()}


def wrong_way(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in g.items():
        for dst in sorted(targets):
            if src.startswith("hotcache.adapters"):
                if dst.startswith("hotcache.provision") and dst not in ADAPTER_MAY_IMPORT:
                    bad.append(f"{src} -> {dst} (adapters use only {sorted(ADAPTER_MAY_IMPORT)})")
                continue
            if dst.startswith("hotcache.adapters"):
                bad.append(f"{src} -> {dst} (provision never imports adapters)")
                continue
            a, b = layer(src), layer(dst)
            if a is None or b is None:
                continue
            if src.split(".")[2] == "errors" and dst != src:
                bad.append(f"{src} -> {dst} (errors.py is a leaf)")
            elif b > a:
                bad.append(f"{src} -> {dst} (against the direction)")
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_imports_run_one_way():
    assert wrong_way(graph()) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_engine_importing_observe_is_against_the_direction():
    g = {"hotcache.provision.engine.status": {"hotcache.provision.observe.metrics"},
         "hotcache.provision.hotcopy.copier": {"hotcache.provision.engine.apply"},
         "hotcache.provision.tend.warm": {"hotcache.provision.observe.progress"}}
    bad = wrong_way(g)
    assert any("engine.status -> hotcache.provision.observe.metrics" in b for b in bad)
    assert any("hotcopy.copier -> hotcache.provision.engine.apply" in b for b in bad)
    assert any("tend.warm -> hotcache.provision.observe.progress" in b for b in bad)


def test_the_checker_sees_a_wrong_way_import_and_a_cycle():
    g = {"hotcache.provision.block.blockdev": {"hotcache.provision.engine.apply"},
         "hotcache.provision.engine.apply": {"hotcache.provision.block.blockdev"},
         "hotcache.adapters.dataroot": {"hotcache.provision.block.blockdev"}}
    bad = wrong_way(g)
    assert any("block.blockdev -> hotcache.provision.engine.apply" in b for b in bad)
    assert any(b.startswith("hotcache.adapters.dataroot") for b in bad)
    assert cycles(g) == [["hotcache.provision.block.blockdev",
                          "hotcache.provision.engine.apply"]]


def backend_modules() -> set[str]:
    """The modules that are backends (backends/__init__.BACKENDS), read from the source."""
    from hotcache.provision.backends import BACKENDS

    return {cls.__module__ for cls in BACKENDS.values()}


def backends_leaning_on_each_other(g: dict[str, set[str]], backends: set[str]) -> list[str]:
    """A backend may share internals (dmtable, dmflush, base...), never import another
    backend: what one needs of another moves into a shared module."""
    return [f"{src} -> {dst}" for src in sorted(backends) for dst in sorted(g.get(src, ()))
            if dst in backends and dst != src]


def test_no_backend_imports_another_backend():
    backends = backend_modules()
    assert len(backends) >= 4
    assert backends_leaning_on_each_other(graph(), backends) == []


def test_the_checker_sees_a_backend_importing_another():
    b, d = "hotcache.provision.backends.bcache", "hotcache.provision.backends.dmcache"
    assert backends_leaning_on_each_other({d: {b, "hotcache.provision.backends.parts.dmtable"}},
                                          {b, d}) == [f"{d} -> {b}"]


def test_the_backends_folder_holds_the_backends_and_parts_holds_the_rest():
    """backends/ lists what a reader looks for there: the registry, what a backend is
    (base.py) and one module per backend; what they are built from lies in parts/."""
    folder = ROOT / "provision" / "backends"
    top = {p.stem for p in folder.glob("*.py")} - {"__init__", "base"}
    assert top == {m.rsplit(".", 1)[1] for m in backend_modules()}


def bench_imports(source: str, filename: str = "<test>") -> list[str]:
    """The imports of `bench` (or a module inside it) in one test module's source."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [n for n in names if n == "bench" or n.startswith("bench.")]
    return found


def test_tests_never_import_the_benchmarks():
    """The test tiers stand on their own: what a benchmark shares with them (the guest
    boot) lives under tests/ or in the package, and bench/ imports it from there."""
    bad = {str(p.relative_to(ROOT)): found for p in (ROOT / "tests").rglob("*.py")
           if (found := bench_imports(p.read_text(), str(p)))}
    assert bad == {}


def test_the_checker_sees_a_test_importing_a_benchmark():
    assert bench_imports("from bench import vmboot\nimport bench.vmbench as v\n"
                         "def f():\n    import bench\n") == ["bench", "bench.vmbench", "bench"]
    assert bench_imports("import benchmark\nfrom .bench import x\nimport vmboot\n") == []
