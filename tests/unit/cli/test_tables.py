"""Tables off a terminal: `hotcache copies | cat` and `hotcache devices | cat` print a
header and one whole line a row, cells separated by tabs, as lsblk, lvs and kubectl do
in a pipe; on a terminal the table folds a long cell and never cuts it."""

from __future__ import annotations

import io
import json
import os
import re
import sys

import pytest

from hotcache.provision.cli.common import print_table
from tests.helpers import hotcache

CUT = "…"


@pytest.fixture
def env(tmp_path):
    return {"HOTCACHE_STATE": str(tmp_path / "m.yaml"), "HOTCACHE_METRICS_DIR": ""}


def test_copies_in_a_pipe_keeps_whole_paths_and_timestamps(tmp_path, env):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(1000))
    root = tmp_path / "hot" / ("a folder name long enough " * 4).strip() / ("deeper " * 12).strip()
    dest = root / "imagenet-val"
    assert len(str(dest)) > 200
    root.mkdir(parents=True)
    hotcache("copy", src, dest, env=env, check=True)
    hotcache("verify", dest, "--full", env=env, check=True)
    verified_at = json.loads(hotcache("copies", root, "--json", env=env).stdout)["copies"][0][
        "verified_at"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", verified_at)

    proc = hotcache("copies", root, env=env, check=True)    # stdout is a pipe
    assert CUT not in proc.stdout
    header, row = proc.stdout.splitlines()
    assert header.split("\t") == ["name", "version", "path", "files", "bytes",
                                  "last verified", "state"]
    assert row.split("\t") == ["src", "1", str(dest), "1", "1000 B", verified_at, "verified"]


def test_devices_in_a_pipe_is_one_line_per_device(env):
    # The host's devices are the host's: a loop device attached or detached by another
    # test process between two listings changes them, so the table is compared with a
    # JSON listing taken just before and just after it that agree.
    for _ in range(5):
        devices = json.loads(hotcache("devices", "--json", env=env, check=True).stdout)[
            "devices"]
        proc = hotcache("devices", env=env, check=True)
        after = json.loads(hotcache("devices", "--json", env=env, check=True).stdout)[
            "devices"]
        if [d["node"] for d in after] == [d["node"] for d in devices]:
            break
    lines = proc.stdout.splitlines()
    assert CUT not in proc.stdout
    assert lines[0].split("\t")[:2] == ["device", "size"]
    assert [ln.split("\t")[0] for ln in lines[1:]] == [d["node"] for d in devices]
    assert all(len(ln.split("\t")) == 8 for ln in lines)


def test_several_values_join_with_commas_and_control_characters_are_escaped(capsys):
    print_table(("device", "by-id"), [("/dev/sdb", ["ata-ONE", "wwn-0x5000"]),
                                      ("/dev/sdc\nx", "-")])
    assert capsys.readouterr().out == ("device\tby-id\n/dev/sdb\tata-ONE,wwn-0x5000\n"
                                       "/dev/sdc\\x0ax\t-\n")


def test_on_a_narrow_terminal_a_long_cell_folds_and_is_not_cut(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True
    out = Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.setenv("NO_COLOR", "1")
    path = "/mnt/hot/" + "x" * 30 + "/[class]/" + "y" * 30
    print_table(("name", "path"), [("ds", path), ("ds2", ["a", "b"])])
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())      # the header's bold
    assert CUT not in text and "\t" not in text
    assert max(len(line) for line in text.splitlines()) <= 40
    cells = re.findall(r"│ *(\S*) *│ *(\S*) *│", text)    # (name, path) of each line
    assert "".join(p for _, p in cells[:-2]) == path
    assert [c for c in cells[-2:]] == [("ds2", "a"), ("", "b")]
