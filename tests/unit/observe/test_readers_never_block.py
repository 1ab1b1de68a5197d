"""Readers of files that users can plant (a hot copy's metadata and manifest, a staging
folder's header and journal) never block and never read something else: a FIFO or a
device at the name is refused without waiting for a writer, a huge sparse file is not
read into memory, and root's tools come from the system folders before a user's PATH."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from hotcache.provision.errors import UsageError
from hotcache.provision.hotcopy import format as fmt
from hotcache.provision.system import beneath
from hotcache.provision.system.runner import which


def finishes(fn, *args):
    """fn(*args) in a thread; its result, or a failure if it is still blocked (on a FIFO
    with no writer it would wait forever)."""
    box: list = []

    def run():
        try:
            box.append(("ok", fn(*args)))
        except BaseException as exc:       # noqa: BLE001 - handed back to the test
            box.append(("raised", exc))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():
        with open(args[0] if isinstance(args[0], (str, os.PathLike)) else os.devnull, "wb",
                  opener=lambda p, f: os.open(p, os.O_WRONLY | os.O_NONBLOCK)):
            pass                            # release the reader, then fail
        pytest.fail(f"{fn.__name__} blocked")
    kind, value = box[0]
    if kind == "raised":
        raise value
    return value


def a_copy(tmp_path):
    dest = tmp_path / "imagenet"
    dest.mkdir()
    (dest / fmt.MANIFEST).write_text("")
    return dest


def test_a_fifo_at_the_metadata_is_no_copy_and_does_not_hang(tmp_path):
    dest = a_copy(tmp_path)
    os.mkfifo(dest / fmt.METADATA)
    assert finishes(fmt.read_metadata, dest) is None
    assert stat.S_ISFIFO(os.lstat(dest / fmt.METADATA).st_mode)     # left as it is


def test_a_huge_sparse_metadata_file_is_not_read(tmp_path):
    dest = a_copy(tmp_path)
    with open(dest / fmt.METADATA, "wb") as f:
        f.truncate(64 * 2**30)              # 64 GiB of nothing, as a user can make it
    assert fmt.read_metadata(dest) is None


def test_a_fifo_at_the_manifest_is_an_error_naming_it(tmp_path):
    dest = tmp_path / "c"
    dest.mkdir()
    os.mkfifo(dest / fmt.MANIFEST)
    with pytest.raises(UsageError, match="cannot read the manifest"):
        finishes(fmt.read_manifest, dest / fmt.MANIFEST)


def test_read_file_beneath_refuses_a_fifo_and_a_folder(tmp_path):
    os.mkfifo(tmp_path / "journal")
    (tmp_path / "header").mkdir()
    fd = beneath.open_root(tmp_path)
    try:
        for name in ("journal", "header"):
            with pytest.raises(beneath.NotRegular):
                finishes(beneath.read_file, fd, name)
        (tmp_path / "ok").write_bytes(b"x" * 10)
        assert beneath.read_file(fd, "ok") == b"x" * 10
        with pytest.raises(beneath.NotRegular):
            beneath.read_file(fd, "ok", limit=9)
    finally:
        os.close(fd)


def test_the_metrics_scan_of_a_mount_with_a_planted_fifo_finishes(tmp_path):
    from hotcache.provision.observe.metrics import hot_copies
    from hotcache.provision.records import CacheEntry

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    dest = a_copy(mnt)
    os.mkfifo(dest / fmt.METADATA)
    entry = CacheEntry.model_validate({
        "backend": "none", "state": "ready", "devices": {},
        "filesystem": {"type": "xfs", "uuid": "u", "mountpoint": str(tmp_path / "mnt")},
        "spec": {"name": "c"}})
    rows = finishes(hot_copies, entry, True)
    assert [r["verify_ok"] for r in rows if r["path"] == str(dest)] in ([], [False])


def test_root_tools_come_from_the_system_folders_before_a_users_path(tmp_path, monkeypatch):
    planted = tmp_path / "bin" / "wipefs"
    planted.parent.mkdir()
    planted.write_text("#!/bin/sh\necho gotcha\n")
    planted.chmod(0o755)
    monkeypatch.setenv("PATH", f"{planted.parent}:{os.environ['PATH']}")
    found = which("wipefs")
    assert found and found != str(planted) and found.startswith(("/usr/", "/sbin", "/bin"))


def test_the_metrics_timer_cannot_hang_for_ever():
    from hotcache.provision.observe.metrics import timer_units

    service = next(v for k, v in timer_units("/usr/bin/hotcache", "/tmp/m.prom", "1min", {})
                   .items() if k.endswith(".service"))
    assert "\nTimeoutStartSec=5min\n" in service


def test_the_textfile_writers_follow_no_planted_name(tmp_path):
    """node_exporter's textfile folder can be writable by others: a symlink planted at
    the temp name prometheus_client would use (FILE.<pid>.<thread id>) must not lead the
    metrics or progress writers to write a victim file."""
    import threading

    from hotcache.provision.observe import progress
    from hotcache.provision.observe.metrics import write_textfile

    victim = tmp_path / "victim"
    victim.write_bytes(b"root's own\n")
    out = tmp_path / "textfile" / "hotcache.prom"
    out.parent.mkdir()
    guess = f"{out}.{os.getpid()}.{threading.current_thread().ident}"
    os.symlink(victim, guess)
    write_textfile(out, [], tmp_path / "mappings.yaml")
    assert victim.read_bytes() == b"root's own\n" and "hotcache" in out.read_text()
    assert os.path.islink(guess) and stat.S_IMODE(os.stat(out).st_mode) == 0o644

    meter = progress.wrap(progress.NullMeter(), out.parent, "copy", tmp_path / "dest")
    os.symlink(victim, f"{meter.file}.{os.getpid()}.{threading.current_thread().ident}")
    meter._write(force=True)
    assert victim.read_bytes() == b"root's own\n" and meter.file.read_text()
