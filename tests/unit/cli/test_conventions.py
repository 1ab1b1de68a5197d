"""The conventions every `hotcache` command keeps, through the real entry point: shell
completion, `-h`, `--json` documents that carry their kind and format version and are
the same for the same host, no traceback for an operating-system error, and progress
lines when stderr is not a terminal."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest

from hotcache.provision.errors import ExitCode, OsFailure
from hotcache.provision.system.meter import PlainMeter
from tests.helpers import HOTCACHE, hotcache


@pytest.fixture
def host_env(tmp_path):
    """A host of hotcache's own: mapping, fstab, unit folder under tmp_path, no metrics."""
    return {"HOTCACHE_STATE": str(tmp_path / "m.yaml"), "HOTCACHE_FSTAB": str(tmp_path / "fstab"),
            "HOTCACHE_UNIT_DIR": str(tmp_path / "units"), "HOTCACHE_METRICS_DIR": ""}


@pytest.fixture
def hot_copy(tmp_path, host_env):
    src = tmp_path / "src" / "ds"
    (src / "a").mkdir(parents=True)
    for i in range(40):
        (src / "a" / f"f{i}.bin").write_bytes(os.urandom(50_000))
    dest = tmp_path / "hot" / "ds"
    dest.parent.mkdir()
    hotcache("copy", src, dest, env=host_env, check=True)
    return src, dest


def test_completion_script_is_generated_and_completes_commands():
    # --show-completion detects the shell from the processes above it, which a CI
    # runner may not have: docs/cli.md's way that names the shell works everywhere.
    proc = hotcache(env={"_HOTCACHE_COMPLETE": "source_bash"})
    assert proc.returncode == 0, proc.stderr
    assert "_hotcache_completion" in proc.stdout and "complete " in proc.stdout
    proc = hotcache("--help")
    assert "--install-completion" in proc.stdout
    # what the generated script asks the program when the user presses TAB
    done = subprocess.run([*HOTCACHE], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "_HOTCACHE_COMPLETE": "complete_bash",
                               "COMP_WORDS": "hotcache kube man", "COMP_CWORD": "2"})
    assert done.stdout.split() == ["manifests"], done.stderr


@pytest.mark.parametrize("argv", [[], ["copy"], ["kube"], ["kube", "manifests"]])
def test_dash_h_is_help(argv):
    short, long = hotcache(*argv, "-h"), hotcache(*argv, "--help")
    assert short.returncode == 0 and short.stdout.startswith("Usage: hotcache"), short.stderr
    assert short.stdout == long.stdout


def test_every_reporting_json_has_kind_and_version_and_is_stable(tmp_path, host_env, hot_copy):
    """Each reporting command, twice on the unchanged host: the same bytes, and a kind
    and format_version first. (verify records when it checked, so its document carries
    that time by design; the Kubernetes List names itself as Kubernetes does.) `devices`
    reads the real host, where the root tiers running beside this one attach and detach
    loop devices: a pair that differs is asked again, a few times."""
    _, dest = hot_copy
    (tmp_path / "fstab").write_text("")
    commands = {
        "devices": ["devices"], "backends": ["devices", "--backends"],
        "status": ["status"], "copies": ["copies", dest.parent],
        "doctor": ["doctor", "--system-fstab", tmp_path / "fstab"],
        "kube-labels": ["kube", "labels"], "prune": ["prune", dest.parent],
        "metrics-timer": ["metrics-timer", "--dry-run", "--textfile", tmp_path / "m.prom"],
        "List": ["kube", "manifests"],
        "slurm-features": ["slurm", "features"],
        "slurm-helpers-conf": ["slurm", "helpers-conf"],
    }
    for kind, argv in commands.items():
        for _ in range(5 if argv[0] == "devices" else 1):
            first, second = (hotcache(*argv, "--json", env=host_env) for _ in range(2))
            if first.stdout == second.stdout:
                break
        assert first.stdout == second.stdout, argv
        doc = json.loads(first.stdout)
        assert doc["kind"] == kind, (argv, first.stdout[:200], first.stderr)
        assert list(doc)[:2] == ["kind", "format_version"] and doc["format_version"] == 1 \
            or kind == "List" and doc["apiVersion"] == "v1", argv


def test_an_os_error_is_a_message_and_its_exit_code_and_json(tmp_path, host_env):
    """A real one: the node label file asked for beneath a file."""
    target = tmp_path / "afile"
    target.write_text("")
    proc = hotcache("kube", "labels", "--write", target / "labels", env=host_env)
    assert proc.returncode == ExitCode.OS_ERROR
    assert "Traceback" not in proc.stderr
    assert proc.stderr == (f"hotcache: File exists (EEXIST): {target}\n  next: something "
                           "is in the way of that path: move it or pick another path\n")
    proc = hotcache("kube", "labels", "--write", target / "labels", "--json", env=host_env)
    doc = json.loads(proc.stdout)
    assert (doc["kind"], doc["error"], doc["errno"], doc["exit_code"]) == \
        ("error", "OsFailure", "EEXIST", ExitCode.OS_ERROR)


def test_a_usage_error_under_json_is_an_error_document():
    proc = hotcache("status", "--json", "--no-such-option")
    assert proc.returncode == ExitCode.BAD_INPUT
    doc = json.loads(proc.stdout)
    assert (doc["kind"], doc["error"], doc["exit_code"]) == ("error", "UsageError", 2)
    assert "--no-such-option" in doc["message"] and "--no-such-option" in proc.stderr


@pytest.mark.parametrize("as_json", [False, True])
def test_an_os_error_injected_into_a_command_is_clean(monkeypatch, capsys, host_env, as_json):
    """One raised where no code expects it (the catalog read of `copies`)."""
    from hotcache.provision.cli import main
    from hotcache.provision.hotcopy import catalog

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/srv/hot/ds")
    monkeypatch.setattr(catalog, "find", denied)
    for k, v in host_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sys, "argv", ["hotcache", "copies", *(["--json"] if as_json else [])])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == ExitCode.OS_ERROR == OsFailure.exit_code
    out, err = capsys.readouterr()
    assert err == ("hotcache: Permission denied (EACCES): /srv/hot/ds\n"
                   "  next: run it as root, or give this user access to the path\n")
    if as_json:
        doc = json.loads(out)
        assert doc["kind"] == "error" and doc["path"] == "/srv/hot/ds"
        assert doc["exit_code"] == ExitCode.OS_ERROR
    else:
        assert out == ""


def test_a_copy_off_a_terminal_prints_progress_lines(tmp_path, host_env):
    """stderr is a pipe, as under Ansible, cron or systemd: a line when the copy starts
    and then one per interval (here 10 ms, and the copy held to 4 MB/s), --json or not."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        (src / f"f{i}").write_bytes(os.urandom(250_000))
    proc = hotcache("copy", src, tmp_path / "dest", "--bwlimit", "4M", "--json",
                    env={**host_env, "HOTCACHE_PROGRESS_SECONDS": "0.01"}, check=True)
    assert json.loads(proc.stdout)["kind"] == "copy"     # stdout: the document alone
    lines = proc.stderr.splitlines()
    assert lines[0] == f"copy src -> {tmp_path / 'dest'}: 1.9 MiB in 8 files"
    pattern = re.compile(rf"copy src -> {re.escape(str(tmp_path / 'dest'))}: \d+/8 files, "
                         r"[\d.]+ (B|KiB|MiB)/1\.9 MiB \(\d+%\), [\d.]+ (B|KiB|MiB)/s, "
                         r"ETA (\d+:\d\d:\d\d|-)$")
    progress = [ln for ln in lines[1:] if pattern.match(ln)]
    assert progress, proc.stderr


def test_plain_progress_line_says_files_bytes_rate_and_eta():
    now = [100.0]
    out = io.StringIO()
    meter = PlainMeter(interval=3600, out=out, clock=lambda: now[0])
    meter.start("warm pass 1", 4 * 2**30, 5000)
    meter.advance(2**30)
    meter.file_done(1200)
    now[0] += 10
    assert meter.line() == ("warm pass 1: 1200/5000 files, 1.0 GiB/4.0 GiB (25%), "
                            "102.4 MiB/s, ETA 0:00:30")
    meter.stop()
    assert out.getvalue() == "warm pass 1: 4.0 GiB in 5000 files\n"


def test_copy_dry_run_says_what_it_would_copy_and_copies_nothing(tmp_path, host_env,
                                                                 hot_copy):
    src, dest = hot_copy
    (src / "a" / "new.bin").write_bytes(b"n" * 1000)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in dest.parent.rglob("*"))
    proc = hotcache("copy", src, dest, "--dry-run", "--json", env=host_env)
    doc = json.loads(proc.stdout)
    assert (doc["kind"], doc["dry_run"], doc["changed"]) == ("copy", True, False), proc.stderr
    assert (doc["copied_files"], doc["copied_bytes"], doc["reused_files"], doc["version"]) == \
        (1, 1000, 40, "2")
    fresh = tmp_path / "hot" / "fresh"
    doc = json.loads(hotcache("copy", src, fresh, "--dry-run", "--json", env=host_env).stdout)
    assert (doc["copied_files"], doc["version"]) == (41, "1")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in dest.parent.rglob("*")) == before
    text = hotcache("copy", src, dest, "--dry-run", env=host_env).stdout
    assert text.startswith("dry run: would copy 1 files (1000 B)") and "nothing was copied" in text


def test_every_command_that_changes_something_takes_dry_run(tmp_path, host_env):
    for argv in (["apply"], ["teardown"], ["restore"], ["copy"], ["prune"], ["metrics-timer"]):
        assert "--dry-run" in hotcache(*argv, "-h").stdout, argv
    # metrics-timer's old name still works, unlisted, and means the same
    assert "--check" not in hotcache("metrics-timer", "-h").stdout
    args = ["metrics-timer", "--textfile", tmp_path / "m.prom", "--json"]
    old, new = hotcache(*args, "--check", env=host_env), hotcache(*args, "--dry-run", env=host_env)
    assert old.returncode == new.returncode == 0 and old.stdout == new.stdout, old.stderr
    assert not (tmp_path / "units").exists()
