"""Warm-up and copy progress as metrics while the command runs: bytes and files done and
left, rewritten atomically and throttled, with running 0 at the end."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from hotcache.provision.hotcopy import copier
from hotcache.provision.hotcopy.copier import CopyOptions, copy
from hotcache.provision.observe import progress
from hotcache.provision.tend.warm import warm
from hotcache.provision.system.meter import NullMeter
from tests.helpers import hotcache
from tests.unit.hotcopy.test_copy import make_dataset
from tests.unit.observe.test_metrics import promtool_check


def read(file: Path) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(file.read_text()):
        for s in family.samples:
            out[s.name.removeprefix("hotcache_progress_")] = s.value
            out["phase"] = s.labels["phase"]
    return out


class Recording(progress.TextfileMeter):
    """Keeps what each write put in the file, as a scraper polling it would see."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.seen: list[dict] = []

    def _write(self, force: bool = False) -> None:
        before = self.writes
        super()._write(force)
        if self.writes != before:
            self.seen.append(read(self.file))


def test_copy_publishes_bytes_and_files_while_it_runs(tmp_path, monkeypatch):
    # files are counted a batch at a time: several batches, so that some counts fall
    # between none and all
    monkeypatch.setattr(copier, "BATCH_FILES", 4)
    src = make_dataset(tmp_path / "src", n=20, size=50_000)
    files = sum(1 for p in src.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    out = tmp_path / "textfile" / "p.prom"
    meter = Recording(NullMeter(), out, "copy", tmp_path / "hot", interval=0)
    copy(src, tmp_path / "hot", CopyOptions(jobs=2, verify=True), meter)
    meter.stop()
    copying = [s for s in meter.seen if s["phase"].startswith("copy ")]
    assert copying[0] == {**copying[0], "bytes_done": 0, "bytes_left": total, "files_done": 0,
                          "files_left": files, "running": 1}
    middle = [s for s in copying if 0 < s["files_done"] < files]
    assert middle and all(s["bytes_done"] + s["bytes_left"] == total for s in middle)
    assert any(s["phase"] == "read back" for s in meter.seen)          # --verify's phase
    last = read(out)
    assert last["running"] == 0 and last["bytes_left"] == 0 and last["files_left"] == 0
    assert last["files_done"] == files and last["bytes_done"] == total
    promtool_check(out.read_text())
    # an atomic rewrite leaves nothing else in the folder
    assert os.listdir(out.parent) == ["p.prom"]


def test_warm_publishes_each_pass(tmp_path):
    data = make_dataset(tmp_path / "data", n=5, size=10_000)
    meter = Recording(NullMeter(), tmp_path / "w.prom", "warm", data, interval=0)
    warm(data, jobs=2, backend="none", meter=meter)
    meter.stop()
    files = sum(1 for p in data.rglob("*") if p.is_file())
    assert meter.seen[0]["files_left"] == files and meter.seen[0]["running"] == 1
    last = read(tmp_path / "w.prom")
    assert (last["files_done"], last["files_left"], last["bytes_left"], last["running"]) == \
        (files, 0, 0, 0)


def test_writes_are_throttled(tmp_path):
    now = [100.0]
    meter = progress.TextfileMeter(NullMeter(), tmp_path / "t.prom", "warm", tmp_path,
                                   interval=5, clock=lambda: now[0])
    meter.start("warm", 1000, 10)
    for _ in range(10):
        meter.advance(100)
        meter.file_done()
    assert meter.writes == 1                   # the start; the rest came within 5 s
    assert read(tmp_path / "t.prom")["bytes_done"] == 0
    now[0] += 5
    meter.advance(0)
    assert meter.writes == 2 and read(tmp_path / "t.prom")["files_done"] == 10
    meter.stop()                               # the end is always written
    assert meter.writes == 3 and read(tmp_path / "t.prom")["running"] == 0


def test_cli_copy_and_warm_write_progress_where_asked(tmp_path):
    src = make_dataset(tmp_path / "src", n=4, size=1000)
    folder = tmp_path / "node-exporter"
    proc = hotcache("copy", src, tmp_path / "hot", "--metrics-dir", folder)
    assert proc.returncode == 0, proc.stderr
    proc = hotcache("warm", tmp_path / "hot", env={"HOTCACHE_METRICS_DIR": str(folder)})
    assert proc.returncode == 0, proc.stderr
    made = sorted(p.name for p in folder.iterdir())
    assert [n.split("-")[2] for n in made] == ["copy", "warm"]
    for name in made:
        got = read(folder / name)
        assert got["running"] == 0 and got["bytes_left"] == 0 and got["files_done"] > 0
    # off by default here (tests/conftest.py sets the folder empty): nothing written
    proc = hotcache("copy", src, tmp_path / "hot2")
    assert proc.returncode == 0 and sorted(p.name for p in folder.iterdir()) == made


def test_sweep_removes_only_this_accounts_stale_progress_files(tmp_path):
    """The metrics timer's sweep: a day-old progress file of this account goes; a fresh
    one, another account's, a symlink with the progress name (its target untouched) and
    node_exporter's other files stay."""
    from hotcache.provision.observe import progress

    day = 86400
    now = 10 * day
    old, fresh = tmp_path / "hotcache-progress-copy-aaa.prom", \
        tmp_path / "hotcache-progress-warm-bbb.prom"
    others = tmp_path / "hotcache-progress-copy-ccc.prom"
    target = tmp_path / "target.prom"
    link = tmp_path / "hotcache-progress-copy-ddd.prom"
    unrelated = tmp_path / "node.prom"
    for f in (old, fresh, others, target, unrelated):
        f.write_text("x 1\n")
    link.symlink_to(target)
    for f in (old, others, target, unrelated):
        os.utime(f, (now - 2 * day, now - 2 * day))
    os.utime(link, (now - 2 * day, now - 2 * day), follow_symlinks=False)
    os.utime(fresh, (now - 60, now - 60))
    if os.geteuid() == 0:
        os.chown(others, 4242, 4242)
    else:
        others.unlink()                      # cannot give a file away without root
    assert progress.sweep(tmp_path, now=now) == [old.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (fresh, others, target, link, unrelated) if os.path.lexists(p))
    assert target.read_text() == "x 1\n"
