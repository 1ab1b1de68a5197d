"""Ctrl-C and SIGTERM sent to a running `hotcache copy`, as a terminal, systemd or
Ansible's timeout sends them: a real signal to a real process, once its progress shows
that files are being copied. It says it was interrupted and how to finish, prints the
error document under --json, exits 130 or 143, and the same command run again finishes
the copy, keeping what the interrupted run had copied."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from hotcache.provision.errors import ExitCode
from tests.helpers import hotcache

LINE = "hotcache: interrupted; run the same command again to finish"
# The copy runs as `python -m hotcache.provision`, with SIGINT's disposition reset to
# Python's own: a test runner started in the background of a script (CI's tiers) has
# SIGINT ignored, which its children inherit and hotcache rightly keeps.
LAUNCH = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
          "signal.signal(signal.SIGTERM, signal.SIG_DFL); "
          "runpy.run_module('hotcache.provision', run_name='__main__', alter_sys=True)")
DONE = re.compile(r": ([1-9]\d*)/\d+ files, ")


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "HOTCACHE_STATE": str(tmp_path / "m.yaml"), "HOTCACHE_METRICS_DIR": "",
            "HOTCACHE_PROGRESS_SECONDS": "0.02"}


def start_copy(env: dict, src, dest, *args: str, group: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LAUNCH, "copy", str(src), str(dest), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=group)


def signal_once_files_are_done(proc: subprocess.Popen, send) -> tuple[str, list[str]]:
    """Read the copy's progress until a line says a file is done, then `send`; return
    stdout and every stderr line."""
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line.rstrip("\n"))
        if DONE.search(line):
            send()
            break
    else:
        raise AssertionError(f"the copy ended before a file was done: {lines[-3:]}")
    out, rest = proc.communicate(timeout=120)
    return out, lines + rest.splitlines()


def children(pid: int) -> list[int]:
    return [int(c) for task in os.listdir(f"/proc/{pid}/task")
            for c in open(f"/proc/{pid}/task/{task}/children").read().split()]


def ignores(pid: int, sig: signal.Signals) -> bool:
    """Whether the process ignores `sig` (the SigIgn mask of /proc/PID/status)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    raise AssertionError(f"no SigIgn in /proc/{pid}/status")


def dataset(root, files: int, size: int):
    root.mkdir(parents=True)
    for i in range(files):
        (root / f"f{i:04}.bin").write_bytes(os.urandom(size))
    return root


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, ExitCode.INTERRUPTED),
                                       (signal.SIGTERM, ExitCode.TERMINATED)])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_signal_stops_the_copy_with_the_line_the_document_and_its_code(tmp_path, env, sig,
                                                                         code, as_json):
    src = dataset(tmp_path / "src", 640, 4000)
    dest = tmp_path / "hot" / "ds"
    dest.parent.mkdir()
    # one reader held to 128 KiB/s: a batch of 64 files every two seconds, for 20 s
    proc = start_copy(env, src, dest, "-j", "1", "--bwlimit", "128K",
                      *(["--json"] if as_json else []))
    out, err = signal_once_files_are_done(proc, lambda: proc.send_signal(sig))
    assert proc.returncode == code == 128 + sig, err
    assert err[-1] == LINE and "Traceback" not in "\n".join(err)
    if as_json:
        doc = json.loads(out)
        assert list(doc)[:2] == ["kind", "format_version"]
        assert (doc["kind"], doc["error"], doc["exit_code"], doc["signal"]) == \
            ("error", "Interrupted", code, sig.name)
        assert doc["message"] == LINE.removeprefix("hotcache: ")
    else:
        assert out == ""
    assert not dest.exists()        # nothing published

    again = hotcache("copy", src, dest, "--json", env=env, check=True)
    doc = json.loads(again.stdout)
    assert doc["files"] == 640 and doc["resumed_files"] >= 1, doc
    assert doc["copied_files"] + doc["resumed_files"] == 640


def test_sigterm_to_the_whole_group_stops_the_copy_and_its_worker_processes(tmp_path, env):
    """systemd stops a unit by sending SIGTERM to every process in it: with enough small
    files the copy has worker processes, which leave the stopping to the copy."""
    src = dataset(tmp_path / "src", 2100, 200)      # over lanes.MANY: worker processes
    dest = tmp_path / "ds"
    # held to 20 KiB/s: a batch of 64 files about every 0.6 s, for 20 s
    proc = start_copy(env, src, dest, "-j", "2", "--bwlimit", "20K", "--json", group=True)
    ignoring = []

    def stop() -> None:
        ignoring.extend(ignores(worker, signal.SIGTERM) for worker in children(proc.pid))
        os.killpg(proc.pid, signal.SIGTERM)
    out, err = signal_once_files_are_done(proc, stop)
    assert ignoring == [True, True], "the two worker processes leave SIGTERM to the copy"
    assert proc.returncode == ExitCode.TERMINATED, err
    assert err[-1] == LINE and "Traceback" not in "\n".join(err)
    assert json.loads(out)["signal"] == "SIGTERM"
    again = json.loads(hotcache("copy", src, dest, "--json", env=env, check=True).stdout)
    assert again["files"] == 2100 and again["resumed_files"] >= 1, again
