"""`python -m hotcache.adapters.compare`: same settings, two roots, side by side."""

from __future__ import annotations

import json
import subprocess
import sys

from .helpers import make_jpegs, write_hot_copy

COMPARE = [sys.executable, "-m", "hotcache.adapters.compare"]


def test_cold_and_hot_side_by_side(tmp_path):
    make_jpegs(tmp_path / "src", per_class=4)
    write_hot_copy(tmp_path / "src", tmp_path / "hot")
    args = ["--cold", str(tmp_path / "src"), "--hot", str(tmp_path / "hot"), "--workers", "0",
            "--batch-size", "4", "--image-size", "8", "--step-ms", "1"]
    out = subprocess.run([*COMPARE, *args, "--json"], capture_output=True, text=True, check=True)
    cold, hot = json.loads(out.stdout)
    assert (cold["label"], cold["hot"], hot["label"], hot["hot"]) == ("cold", False, "hot", True)
    assert cold["samples"] == hot["samples"] == 12 and cold["batches"] == 3
    assert 0 < hot["au"] <= 1 and hot["timing"]["verdict"]
    text = subprocess.run([*COMPARE, *args], capture_output=True, text=True, check=True).stdout
    assert "hot copy" in text and "wait p99" in text and str(tmp_path / "hot") in text


def test_missing_root_is_refused_with_its_name(tmp_path):
    proc = subprocess.run([*COMPARE, "--cold", str(tmp_path / "nope"), "--hot", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--cold" in proc.stderr and "nope" in proc.stderr
