"""`.ci/run` lints and type-checks provision/ and adapters/ before the host tiers, a
finding fails the run (and stops the guest tier it started), its tiers side by side
cover every test folder once, and mypy sees the two folders under the package names
Python imports them by."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def function(lines: list[str], name: str) -> list[str]:
    """The body of shell function `name` in `lines`."""
    body = lines[lines.index(f"{name}() {{") + 1:]
    return body[:body.index("}")]


def test_ci_runs_ruff_and_mypy_on_both_packages_before_the_tests():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "set -euo pipefail" in lines[:lines.index("lint() {")]     # a finding stops the run
    lint = function(lines, "lint")
    ruff = lint.index(".venv/bin/ruff check provision adapters")
    mypy = lint.index(".venv/bin/mypy -p hotcache.provision -p hotcache.adapters")
    assert ruff < mypy
    assert any("-m pytest" in line for line in function(lines, "start"))
    # one tier: lint, then pytest
    branch = lines[lines.index("if (($#)); then"):lines.index("fi")]
    assert branch.index("lint") < next(i for i, line in enumerate(branch) if "-m pytest" in line)
    # the whole run: every tier it runs (in the foreground or started in the
    # background) comes after a lint, but the guest tier's, which is stopped when the
    # run stops early
    whole = lines[lines.index("fi"):]
    functions = {i for start, line in enumerate(whole) if line.endswith("() {")
                 for i in range(start, whole.index("}", start) + 1)}
    lint = whole.index("lint")
    runs = [i for i, line in enumerate(whole) if i not in functions and
            line.startswith(("start ", ".venv/bin/python -m pytest"))]
    guest = whole.index("start guest-kernel tests/vm")
    assert all(lint < i for i in runs if i != guest), runs
    trap = next(i for i, line in enumerate(whole) if line.startswith("trap ") and
                line.endswith(" EXIT") and line != "trap - EXIT")
    assert trap < guest < lint
    assert any("kill -TERM" in line for line in function(lines, whole[trap].split()[1]))
    # the foreground run leaves out exactly the tiers started beside it
    (host,) = [whole[i] for i in runs if whole[i].startswith(".venv/bin/python -m pytest")]
    ignored = set(re.findall(r"--ignore=(\S+)", host))
    started = {whole[i].split()[2] for i in runs if whole[i].startswith("start ")}
    assert ignored == started == {"tests/vm", "tests/unit"}


def test_mypy_path_maps_the_package_names_to_the_folders():
    config = (ROOT / "pyproject.toml").read_text().split("[tool.mypy]\n", 1)[1]
    assert 'packages = ["hotcache.provision", "hotcache.adapters"]' in config
    mypy_path = re.search(r'^mypy_path = "\$MYPY_CONFIG_FILE_DIR/(.+)"$', config, re.M)
    assert mypy_path, "pyproject's [tool.mypy] has no mypy_path beside the config file"
    root = ROOT / mypy_path.group(1)
    for name in ("provision", "adapters"):
        assert (root / "hotcache" / name).resolve() == (ROOT / name).resolve()
