"""tests/vm/vmboot.py on the host: a session that is stopping boots no further guest,
and the checkout is byte-compiled (with pytest's rewrite of the guest modules) before
the first boot, since the guests see it read-only. Each runs in a Python of its own:
this session's guests boot through the same module meanwhile."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import vmboot

pytestmark = pytest.mark.root


def in_fresh_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=vmboot.HERE, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(vmboot.HERE)})


def test_a_stopped_session_boots_no_guest():
    done = in_fresh_python(
        "import subprocess, vmboot\n"
        "started = []\n"
        "subprocess.Popen = lambda *a, **k: started.append(a)\n"
        "vmboot._compiled = True\n"
        "vmboot.stop_all()\n"
        "res = vmboot.boot('true', vmboot.REPO, '', 60)\n"
        "print(res.returncode, started, res.stdout.strip())\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1 [] not booted: the session is stopping"


def test_precompile_leaves_what_a_read_only_guest_reads():
    sources = [vmboot.REPO / "provision" / "engine" / "teardown.py",   # imported lazily
               vmboot.HERE / "guest" / "vmlib.py"]
    for src in sources:
        Path(importlib.util.cache_from_source(str(src))).unlink(missing_ok=True)
    rewritten = vmboot.HERE / "guest" / "__pycache__"
    for old in rewritten.glob("guest_backends.*-pytest-*.pyc"):
        old.unlink()
    done = in_fresh_python("import vmboot; vmboot.precompile()")
    assert done.returncode == 0, done.stderr
    for src in sources:
        assert Path(importlib.util.cache_from_source(str(src))).exists(), src
    tag = sys.implementation.cache_tag
    assert list(rewritten.glob(f"guest_backends.{tag}-pytest-*.pyc")), \
        "no pytest rewrite of the guest modules"
