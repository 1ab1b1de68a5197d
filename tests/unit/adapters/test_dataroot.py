"""data_root(): which folder a training job really reads, said in one log line."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from hotcache.adapters import data_root
from hotcache.adapters import blockinfo
from hotcache.adapters.errors import DataRootError

from .helpers import make_jpegs, write_half_copy, write_hot_copy


@pytest.fixture
def roots(tmp_path):
    src = tmp_path / "hdd" / "toy"
    make_jpegs(src, per_class=2)
    hot = write_hot_copy(src, tmp_path / "ssd" / "toy", name="toy", version="7")
    return src, hot


def lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "hotcache.adapters"]


def test_switching_data_root_changes_logged_path_and_hot_flag(roots, monkeypatch, caplog):
    src, hot = roots
    caplog.set_level(logging.INFO, logger="hotcache.adapters")
    monkeypatch.setenv("DATA_ROOT", str(src))
    cold = data_root(json_log=True)
    monkeypatch.setenv("DATA_ROOT", str(hot))
    warm = data_root(json_log=True)
    first, second = (json.loads(m) for m in lines(caplog))
    assert (first["path"], first["hot"], first["copy"]["state"]) == (str(src), False, "cold")
    assert (second["path"], second["hot"]) == (str(hot), True)
    assert second["copy"]["name"] == "toy" and second["copy"]["version"] == "7"
    assert second["copy"]["verified_at"]
    assert first["fs"] and first["fs"] == second["fs"]          # mountinfo found the filesystem
    assert cold.path == src and warm.copy.is_hot and not cold.copy.is_hot


def test_exactly_one_text_line_per_call_with_rank(roots, monkeypatch, caplog):
    src, hot = roots
    caplog.set_level(logging.INFO, logger="hotcache.adapters")
    monkeypatch.setenv("DATA_ROOT", str(hot / "cat"))           # a folder inside the copy
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("HOTCACHE_LOG", raising=False)
    root = data_root()
    (line,) = lines(caplog)
    assert line.startswith(f"data_root path={hot / 'cat'} ")
    assert "hot=yes" in line and "version=7" in line and "rank=3" in line and "local_rank=1" in line
    assert root.copy.root == str(hot)


def test_json_when_env_asks(roots, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="hotcache.adapters")
    monkeypatch.setenv("DATA_ROOT", str(roots[1]))
    monkeypatch.setenv("HOTCACHE_LOG", "json")
    data_root()
    assert json.loads(lines(caplog)[0])["event"] == "data_root"


def test_default_used_only_when_unset(roots, monkeypatch):
    src, hot = roots
    monkeypatch.delenv("DATA_ROOT", raising=False)
    assert data_root(src).source == "default"
    monkeypatch.setenv("DATA_ROOT", str(hot))
    assert data_root(src).path == hot


def test_missing_root_names_variable_and_every_path_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("DATA_ROOT", str(tmp_path / "gone"))
    with pytest.raises(DataRootError) as err:
        data_root(tmp_path / "also-gone")
    text = str(err.value)
    assert "DATA_ROOT=" in text and str(tmp_path / "gone") in text
    assert str(tmp_path / "also-gone") in text
    monkeypatch.delenv("DATA_ROOT")
    with pytest.raises(DataRootError, match="DATA_ROOT is not set"):
        data_root()


def test_expect_hot_refuses_cold_path(roots, monkeypatch):
    monkeypatch.setenv("DATA_ROOT", str(roots[0]))
    with pytest.raises(DataRootError, match="is not a hot copy"):
        data_root(expect="hot")
    monkeypatch.setenv("DATA_ROOT_EXPECT", "hot")
    with pytest.raises(DataRootError, match="a hot copy was expected"):
        data_root()
    monkeypatch.setenv("DATA_ROOT", str(roots[1]))
    assert data_root().copy.is_hot


def test_half_written_copy_is_never_hot(roots, tmp_path, monkeypatch):
    src, _ = roots
    dest = tmp_path / "ssd" / "half"
    stage = write_half_copy(src, dest)
    monkeypatch.setenv("DATA_ROOT", str(stage))
    assert data_root().copy.state == "staging"
    with pytest.raises(DataRootError, match="half-written"):
        data_root(expect="hot")
    # The destination exists but holds no metadata while the staging folder is there.
    dest.mkdir()
    monkeypatch.setenv("DATA_ROOT", str(dest))
    with pytest.raises(DataRootError, match="half-written"):
        data_root(expect="hot")


def test_unverified_copy_is_refused_when_hot_expected(roots, tmp_path, monkeypatch):
    copy = write_hot_copy(roots[0], tmp_path / "ssd" / "unverified", verified=False)
    monkeypatch.setenv("DATA_ROOT", str(copy))
    assert data_root().copy.state == "unverified"
    with pytest.raises(DataRootError, match="verification"):
        data_root(expect="hot")


def test_real_device_behind_tmp_path(tmp_path):
    """On this host: the real mountinfo and sysfs of the folder pytest gave us."""
    found = blockinfo.backing_of(tmp_path)
    st = os.stat(tmp_path)
    assert found.devnum == f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    assert found.fstype
    if (blockinfo.SYS_DEV_BLOCK / found.devnum).exists():
        assert found.device == (blockinfo.SYS_DEV_BLOCK / found.devnum).resolve().name
    assert found.cache == "none"


def _fake_dm(sysroot, name, devnum, dm_name, uuid, slaves):
    dev = sysroot / "devices" / "virtual" / "block" / name
    (dev / "dm").mkdir(parents=True)
    (dev / "dm" / "name").write_text(dm_name + "\n")
    (dev / "dm" / "uuid").write_text(uuid + "\n")
    (dev / "slaves").mkdir()
    for s in slaves:
        target = sysroot / "class" / "block" / s
        target.mkdir(parents=True, exist_ok=True)
        (dev / "slaves" / s).symlink_to(target)
    (sysroot / "dev" / "block" / devnum).symlink_to(dev)
    return dev


def test_cache_kind_from_sysfs_layout(tmp_path, monkeypatch):
    """The sysfs shapes of bcache, lvmcache and raw dm-cache, as the guest kernel lays
    them out (this host has neither bcache nor device-mapper to show the real thing)."""
    sysroot = tmp_path / "sys"
    (sysroot / "dev" / "block").mkdir(parents=True)
    (sysroot / "class" / "block").mkdir(parents=True)
    monkeypatch.setattr(blockinfo, "SYS_DEV_BLOCK", sysroot / "dev" / "block")
    bc = sysroot / "devices" / "virtual" / "block" / "bcache0"
    (bc / "bcache").mkdir(parents=True)
    (bc / "bcache" / "cache_mode").write_text("writethrough [writeback] writearound none\n")
    (sysroot / "dev" / "block" / "252:0").symlink_to(bc)
    for i, n in enumerate(["vg-data_corig", "vg-fast_cpool_cdata", "vg-fast_cpool_cmeta"]):
        (sysroot / "class" / "block" / f"dm-{i + 1}" / "dm").mkdir(parents=True)
        (sysroot / "class" / "block" / f"dm-{i + 1}" / "dm" / "name").write_text(n)
    _fake_dm(sysroot, "dm-0", "253:0", "vg-data", "LVM-abcdef", ["dm-1", "dm-2", "dm-3"])
    _fake_dm(sysroot, "dm-4", "253:4", "hot", "", ["vda", "vdb", "vdc"])
    _fake_dm(sysroot, "dm-5", "253:5", "vg-plain", "LVM-xyz", ["vdb"])
    # hotcache's raw dm-cache: the top device hc-hot maps the cache device hc-hot-cache
    (sysroot / "class" / "block" / "dm-4").symlink_to(sysroot / "devices" / "virtual" /
                                                      "block" / "dm-4")
    _fake_dm(sysroot, "dm-6", "253:6", "hc-hot", "", ["dm-4"])
    _fake_dm(sysroot, "dm-7", "253:7", "plain-linear", "", ["dm-5"])
    assert blockinfo.classify("252:0")[1] == "bcache"
    assert blockinfo.classify("253:0")[1] == "lvmcache"
    assert blockinfo.classify("253:4")[1] == "dm-cache"
    assert blockinfo.classify("253:5")[1] == "none"
    assert blockinfo.classify("253:6")[1:3] == ("dm-cache", "dm hc-hot on hot")
    assert blockinfo.classify("253:7")[1] == "none"     # a linear on a plain dm device
    assert blockinfo.classify("0:45")[1] == "none"       # tmpfs, overlay: no block device
    # a block device sysfs no longer lists was removed on the host: no verdict, and why
    assert blockinfo.classify("9:9")[1:3] == ("unknown", "block device 9:9 is gone from /sys")
    # /sys not visible at all (a container without it): unknown, never a guess
    monkeypatch.setattr(blockinfo, "SYS_DEV_BLOCK", tmp_path / "nosys" / "dev" / "block")
    assert blockinfo.classify("252:0")[1:3] == ("unknown", "/sys/dev/block is not visible here")


def test_import_pulls_in_no_framework_and_no_cli_library():
    code = ("import sys, hotcache.adapters as a; a.data_root; a.timed; "
            "bad = [m for m in ('torch', 'tensorflow', 'typer', 'pyudev', 'rich', 'yaml') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_data_root_is_its_path_in_str_fstrings_and_fspath(roots, monkeypatch):
    monkeypatch.setenv("DATA_ROOT", str(roots[1]))
    root = data_root()
    assert isinstance(root, os.PathLike)
    assert str(root) == os.fspath(root) == f"{root}" == str(roots[1])
    assert f"{root}/train-{{000..099}}.tar" == f"{roots[1]}/train-{{000..099}}.tar"
    assert f"{root:>{len(str(roots[1])) + 2}}" == "  " + str(roots[1])
    assert repr(root).startswith("DataRoot(path=")          # the repr still tells it all


PLAIN_SCRIPT = """
from hotcache.adapters import data_root, timed
root = data_root()
for batch in timed(range(3), name="plain"):
    pass
"""


def run_plain(env: dict, script: str = PLAIN_SCRIPT) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "HOTCACHE_LOG"}
    return subprocess.run([sys.executable, "-c", script], env={**full, **env}, check=False,
                          capture_output=True, text=True, timeout=120)


def test_a_plain_script_shows_the_line_on_stderr(roots):
    """A script that configured no logging still shows data_root's resolved path and
    timed()'s summary, on stderr; stdout stays the script's own."""
    done = run_plain({"DATA_ROOT": str(roots[1] / "cat" / "..")})
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert f"INFO hotcache.adapters: data_root path={roots[1]} " in done.stderr
    assert "hot=yes" in done.stderr
    assert "INFO hotcache.adapters: timing plain epoch=0 batches=3 " in done.stderr


def test_hotcache_log_silences_the_lines_or_makes_them_json(roots):
    silent = run_plain({"DATA_ROOT": str(roots[1]), "HOTCACHE_LOG": "off"})
    assert silent.returncode == 0 and silent.stderr == "" and silent.stdout == ""

    as_json = run_plain({"DATA_ROOT": str(roots[1]), "HOTCACHE_LOG": "json"})
    assert as_json.returncode == 0, as_json.stderr
    records = [json.loads(line.split(": ", 1)[1]) for line in as_json.stderr.splitlines()]
    assert [r["event"] for r in records] == ["data_root", "batch_timing"]
    assert records[0]["path"] == str(roots[1]) and records[1]["batches"] == 3



def test_an_unknown_hotcache_log_is_warned_about_once_and_never_stops_the_job(roots):
    """HOTCACHE_LOG=debug (not one of text, json, off): one warning naming it and the
    choices, then the default form; data_root() returns and the loop runs."""
    bad = run_plain({"DATA_ROOT": str(roots[1]), "HOTCACHE_LOG": "debug"})
    assert bad.returncode == 0, bad.stderr
    warnings = [line for line in bad.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "HOTCACHE_LOG='debug'" in warnings[0]
    assert "text, json, off" in warnings[0]
    assert f"INFO hotcache.adapters: data_root path={roots[1]} " in bad.stderr
    assert "INFO hotcache.adapters: timing plain epoch=0 batches=3 " in bad.stderr


def test_a_level_on_the_hotcache_logger_silences_the_info_lines(roots):
    """The standard API: a WARNING level on "hotcache" (the package's logger, above
    "hotcache.adapters") drops the info lines, with or without logging configured."""
    for setup in ("", "logging.basicConfig(stream=sys.stdout, level=logging.INFO)\n"):
        quiet = PLAIN_SCRIPT.replace(
            "root = data_root()", "import logging, sys\n" + setup +
            "logging.getLogger('hotcache').setLevel(logging.WARNING)\n"
            "root = data_root()")
        done = run_plain({"DATA_ROOT": str(roots[1])}, quiet)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "" and done.stderr == "", setup
    # set after the first line too: the next lines follow it
    later = PLAIN_SCRIPT.replace(
        "for batch in", "import logging\n"
        "logging.getLogger('hotcache').setLevel(logging.WARNING)\nfor batch in")
    done = run_plain({"DATA_ROOT": str(roots[1])}, later)
    assert "data_root path=" in done.stderr and "timing" not in done.stderr


def test_configured_logging_decides_and_the_default_handler_stands_aside(roots):
    """Once the application sets up logging, the line goes through its handlers and
    levels, once, and no longer to the default stderr handler."""
    configured = PLAIN_SCRIPT.replace(
        "root = data_root()", "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='app %(message)s')\n"
        "root = data_root()")
    shown = run_plain({"DATA_ROOT": str(roots[1])}, configured)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == ""
    assert shown.stdout.count("app data_root path=") == 1
    quiet = run_plain({"DATA_ROOT": str(roots[1])}, configured.replace("level=logging.INFO",
                                                                       "level=logging.WARNING"))
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_a_handler_of_the_applications_own_on_hotcaches_logger_is_used_alone(roots):
    own = PLAIN_SCRIPT.replace(
        "root = data_root()", "import logging, sys\n"
        "mine = logging.StreamHandler(sys.stdout)\n"
        "logging.getLogger('hotcache.adapters').addHandler(mine)\n"
        "logging.getLogger('hotcache.adapters').setLevel(logging.INFO)\n"
        "root = data_root()")
    shown = run_plain({"DATA_ROOT": str(roots[1])}, own)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == "" and shown.stdout.startswith(f"data_root path={roots[1]} ")


def test_a_bcache_running_without_its_cache_set_is_reported_failed(tmp_path, monkeypatch):
    """bcache's state is in sysfs for everyone: a backing device that runs without its
    cache set (what the kernel does when the SSD fails) is named, with its dirty data; one
    with its cache attached is not."""
    sysroot = tmp_path / "sys"
    (sysroot / "dev" / "block").mkdir(parents=True)
    monkeypatch.setattr(blockinfo, "SYS_DEV_BLOCK", sysroot / "dev" / "block")
    bc = sysroot / "devices" / "virtual" / "block" / "bcache0" / "bcache"
    bc.mkdir(parents=True)
    (sysroot / "dev" / "block" / "252:0").symlink_to(bc.parent)
    (bc / "state").write_text("clean\n")
    (bc / "cache").symlink_to(tmp_path)             # attached to a cache set
    assert blockinfo.cache_failure("252:0", "bcache0", "bcache") is None
    (bc / "cache").unlink()
    (bc / "state").write_text("no cache\n")
    (bc / "dirty_data").write_text("0.0k\n")
    said = blockinfo.cache_failure("252:0", "bcache0", "bcache")
    assert said.startswith("/dev/bcache0, bcache runs it without its cache set") and \
        said.endswith("dirty data 0.0k"), said
    assert blockinfo.cache_failure("253:4", "dm-4", "dm-cache") is None   # needs root: host


def test_data_root_warns_when_the_cache_failed(roots, monkeypatch, caplog):
    """The job's own log says the cache failed, in the words status uses; the line
    carries cache_state=failed."""
    from hotcache.adapters import dataroot

    real = dataroot.backing_of
    monkeypatch.setattr(dataroot, "backing_of", lambda p: blockinfo.Backing(
        **{**real(p).to_dict(), "cache": "bcache", "cache_failed": "/dev/bcache0, it broke"}))
    monkeypatch.setenv("DATA_ROOT", str(roots[1]))
    caplog.set_level(logging.INFO, logger="hotcache.adapters")
    data_root(json_log=False)
    line, warning = lines(caplog)
    assert "cache=bcache cache_state=failed" in line
    assert warning.startswith("data_root: cache failed: /dev/bcache0, it broke")
