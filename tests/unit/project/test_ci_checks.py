"""`.ci/run` lints and type-checks provision/ and adapters/ before the host tiers, a
finding fails the run (and stops the guest tier it started), and mypy sees the two
folders under the package names Python imports them by."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_ci_runs_ruff_and_mypy_on_both_packages_before_the_tests():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "set -euo pipefail" in lines[:lines.index("lint() {")]     # a finding stops the run
    body = lines[lines.index("lint() {"):lines.index("}")]
    ruff = body.index(".venv/bin/ruff check provision adapters")
    mypy = body.index(".venv/bin/mypy -p hotcache.provision -p hotcache.adapters")
    assert ruff < mypy
    # each pytest run (one tier, the host tiers) comes after a lint
    runs = [i for i, line in enumerate(lines) if "-m pytest" in line and "-ra tests/vm" not in line]
    assert runs and all("lint" in lines[i - 1] or "lint" in lines[i - 2] for i in runs), runs
    # the guest tier, started before the lint, is stopped when the run stops early
    guest = next(i for i, line in enumerate(lines) if "-m pytest -ra tests/vm" in line)
    trap = next(i for i, line in enumerate(lines) if line.startswith("trap ") and "EXIT" in line)
    assert guest < trap < runs[-1] and "kill -TERM" in lines[trap]


def test_mypy_path_maps_the_package_names_to_the_folders():
    config = (ROOT / "pyproject.toml").read_text().split("[tool.mypy]\n", 1)[1]
    assert 'packages = ["hotcache.provision", "hotcache.adapters"]' in config
    mypy_path = re.search(r'^mypy_path = "\$MYPY_CONFIG_FILE_DIR/(.+)"$', config, re.M)
    assert mypy_path, "pyproject's [tool.mypy] has no mypy_path beside the config file"
    root = ROOT / mypy_path.group(1)
    for name in ("provision", "adapters"):
        assert (root / "hotcache" / name).resolve() == (ROOT / name).resolve()
