"""`python -m hotcache.adapters.compare --drop-caches` (root): the page cache is dropped
before each run, as the kernel's own residency report (util-linux `fincore`) shows."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.loop.test_warm import resident
from tests.unit.adapters.helpers import make_jpegs, write_hot_copy

pytestmark = pytest.mark.root
COMPARE = [sys.executable, "-m", "hotcache.adapters.compare"]


def test_drop_caches_empties_the_page_cache_before_each_run(tmp_path):
    """The cold run reads the source first, the hot run the copy second: with the cache
    dropped before each run, the source's pages are gone by the end (dropped before the
    hot run) while the copy's are there (read after its drop). A file neither run reads
    shows that the drop really happened."""
    make_jpegs(tmp_path / "src", per_class=10)
    write_hot_copy(tmp_path / "src", tmp_path / "hot")
    src = sorted((tmp_path / "src").rglob("*.jpg"))
    hot = sorted((tmp_path / "hot").rglob("*.jpg"))
    bystander = tmp_path / "bystander"
    bystander.write_bytes(b"b" * (1 << 20))
    args = ["--cold", str(tmp_path / "src"), "--hot", str(tmp_path / "hot"), "--workers", "0",
            "--batch-size", "10", "--image-size", "8", "--step-ms", "0", "--json"]
    subprocess.run(["sync"], check=True)

    def run(*extra) -> list[dict]:
        bystander.read_bytes()
        proc = subprocess.run([*COMPARE, *args, *extra], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    runs = run()
    assert [r["samples"] for r in runs] == [30, 30]
    assert resident(src) > 0 and resident([bystander]) == 1 << 20   # nothing dropped
    runs = run("--drop-caches")
    assert [r["samples"] for r in runs] == [30, 30]
    assert resident([bystander]) == 0
    assert resident(src) == 0 and resident(hot) > 0
