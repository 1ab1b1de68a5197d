"""The Ansible role and playbooks pass ansible-lint's production profile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


def test_ansible_lint_production_profile(tmp_path):
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
           "ANSIBLE_HOME": str(tmp_path / "ansible-home"), "NO_COLOR": "1"}
    proc = subprocess.run([str(venv_bin / "ansible-lint"), "--nocolor"], cwd=PLAYBOOKS,
                          capture_output=True, text=True, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Profile 'production' was required, and it passed" in out
