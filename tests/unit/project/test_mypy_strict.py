"""Every module of hotcache (provision/ with its top-level modules and each package, and
adapters/, the training side) is type-checked with every flag of mypy's `--strict`, set per module in pyproject.toml's [tool.mypy]: read
here the way mypy reads it, so that relaxing one flag fails a test, and checked on a
planted untyped def, so that the setting demonstrably reaches those packages."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

mypy_main = pytest.importorskip("mypy.main")

ROOT = Path(__file__).resolve().parents[3]
STRICT_PACKAGES = ("hotcache.provision", "hotcache.provision.backends", "hotcache.provision.block",
                   "hotcache.provision.tend", "hotcache.provision.engine",
                   "hotcache.provision.system", "hotcache.provision.hotcopy",
                   "hotcache.provision.observe", "hotcache.provision.cli",
                   "hotcache.adapters")
# Each package itself, a module of it and of a subpackage.
MODULES = ("hotcache.provision", "hotcache.provision.mapping", "hotcache.provision.records",
           "hotcache.provision.backends", "hotcache.provision.backends.bcache",
           "hotcache.provision.backends.parts", "hotcache.provision.backends.parts.dmtable",
           "hotcache.provision.block", "hotcache.provision.block.host",
           "hotcache.provision.tend", "hotcache.provision.tend.failover",
           "hotcache.provision.engine", "hotcache.provision.engine.apply",
           "hotcache.provision.engine.restore", "hotcache.provision.engine.recheck",
           "hotcache.provision.system", "hotcache.provision.system.beneath",
           "hotcache.provision.hotcopy", "hotcache.provision.hotcopy.copier",
           "hotcache.provision.observe", "hotcache.provision.observe.doctor",
           "hotcache.provision.cli", "hotcache.provision.cli.common",
           "hotcache.adapters", "hotcache.adapters.dataroot")


def options(*args: str):
    """The options mypy runs with for these command-line arguments."""
    return mypy_main.process_options(list(args))[1]


def test_the_kernel_packages_get_every_flag_of_strict(tmp_path):
    empty = tmp_path / "mypy.ini"
    empty.write_text("[mypy]\n")
    lenient = options("--config-file", str(empty), "-c", "pass").snapshot()
    strict = options("--strict", "--config-file", str(empty), "-c", "pass").snapshot()
    # What --strict changes, as this mypy defines it (a newer mypy's new flag included).
    wanted = {k: v for k, v in strict.items() if lenient.get(k) != v}
    assert {"disallow_untyped_defs", "disallow_incomplete_defs", "check_untyped_defs"} <= \
        wanted.keys()
    ours = options("--config-file", str(ROOT / "pyproject.toml"))   # its `packages`
    for module in MODULES:
        seen = ours.clone_for_module(module).snapshot()
        relaxed = {k: seen.get(k) for k, v in wanted.items() if seen.get(k) != v}
        assert not relaxed, f"{module} is not checked strictly: {relaxed}"


def mypy_config(text: str) -> str:
    """pyproject's [tool.mypy] tables, without the mypy_path that maps the package."""
    tables = re.split(r"^(?=\[)", text, flags=re.M)
    kept = [t for t in tables if t.startswith(("[tool.mypy]", "[[tool.mypy."))]
    assert kept, "pyproject.toml has no [tool.mypy]"
    return "".join(re.sub(r"^mypy_path = .*\n", "", t, flags=re.M) for t in kept)


def test_an_untyped_def_planted_in_a_kernel_package_is_flagged(tmp_path):
    (tmp_path / "pyproject.toml").write_text(mypy_config((ROOT / "pyproject.toml").read_text()))
    planted = []
    # A new module of each strict package, and one of engine/'s modules planted in its
    # place (a module the override names, not only a new one).
    modules = [f"{p}.planted" for p in (*STRICT_PACKAGES, "hotcache.provision.backends.parts")]
    for module in (*modules, "hotcache.provision.engine.recheck"):
        package, name = module.rsplit(".", 1)
        folder = tmp_path.joinpath(*package.split("."))
        folder.mkdir(parents=True, exist_ok=True)
        for parent in (folder, *folder.relative_to(tmp_path).parents):
            init = tmp_path / parent / "__init__.py"
            if not init.exists():
                init.write_text("")
        (folder / f"{name}.py").write_text("def untyped(x):\n    return x\n\n\n"
                                           "def incomplete(x: int, y):\n    return x\n")
        planted.append(f"{module.replace('.', '/')}.py")
    res = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                          "--config-file", "pyproject.toml", "-p", "hotcache"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    for path in planted:
        assert f"{path}:1: error: Function is missing a type annotation  [no-untyped-def]" \
            in res.stdout, res.stdout
        assert f"{path}:5: error: Function is missing a type annotation for one or more " \
            "parameters  [no-untyped-def]" in res.stdout, res.stdout
