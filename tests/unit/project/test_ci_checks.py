"""`.ci/run` lints and type-checks provision/ and adapters/ before any test, and mypy
sees the two folders under the package names Python imports them by."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_ci_runs_ruff_and_mypy_on_both_packages_before_the_tests():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    ruff = lines.index(".venv/bin/ruff check provision adapters")
    mypy = lines.index(".venv/bin/mypy -p hotcache.provision -p hotcache.adapters")
    tests = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert ruff < mypy < tests
    assert "set -euo pipefail" in lines[:tests]     # a finding stops the run


def test_mypy_path_maps_the_package_names_to_the_folders():
    config = (ROOT / "pyproject.toml").read_text().split("[tool.mypy]\n", 1)[1]
    assert 'packages = ["hotcache.provision", "hotcache.adapters"]' in config
    mypy_path = re.search(r'^mypy_path = "\$MYPY_CONFIG_FILE_DIR/(.+)"$', config, re.M)
    assert mypy_path, "pyproject's [tool.mypy] has no mypy_path beside the config file"
    root = ROOT / mypy_path.group(1)
    for name in ("provision", "adapters"):
        assert (root / "hotcache" / name).resolve() == (ROOT / name).resolve()
