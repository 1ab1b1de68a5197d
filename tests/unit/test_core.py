"""The small pieces under the engine: runner, mapping, fstab, sizes, the published schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import jsonschema
import pytest
import yaml

from hotcache.provision import mapping
from hotcache.provision.system import fstab
from hotcache.provision.errors import CommandFailed, MissingProgram, NotRoot
from hotcache.provision.system.runner import Runner, require
from hotcache.provision.engine.spec import json_schema, load_spec, parse_size
from tests.helpers import hotcache

ROOT = Path(__file__).resolve().parents[2]


def test_runner_captures_output_and_raises_typed_error():
    r = Runner()
    assert r.run(["echo", "hello"]).stdout == "hello\n"
    with pytest.raises(CommandFailed) as info:
        r.run(["ls", "/definitely/not/here"])
    err = info.value
    assert err.argv == ["ls", "/definitely/not/here"] and err.returncode != 0
    assert "No such file" in err.stderr and "ls /definitely/not/here" in str(err)


def test_dry_run_records_instead_of_running(tmp_path):
    r = Runner(dry_run=True)
    target = tmp_path / "x"
    r.run(["touch", str(target)])
    assert r.recorded == [["touch", str(target)]] and not target.exists()


def test_missing_program_names_the_debian_package(monkeypatch):
    monkeypatch.setattr("hotcache.provision.system.runner.which", lambda p: None)
    with pytest.raises(MissingProgram) as info:
        require("mkfs.xfs")
    assert info.value.exit_code == 7 and "apt-get install xfsprogs" in str(info.value)


def test_mapping_roundtrip_is_atomic_and_versioned(tmp_path):
    path = tmp_path / "etc" / "mappings.yaml"
    with mapping.editing(path) as data:
        data["caches"]["a"] = {"backend": "none"}
    saved = yaml.safe_load(path.read_text())
    assert saved["schema_version"] == mapping.SCHEMA_VERSION and saved["caches"]["a"]
    assert "tool_version" in saved and "updated" in saved
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_mapping_edits_under_the_lock_do_not_lose_updates(tmp_path):
    path = tmp_path / "m.yaml"

    def add(i):
        with mapping.editing(path) as data:
            data["caches"][f"c{i}"] = {}

    threads = [threading.Thread(target=add, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(mapping.load(path)["caches"]) == 20


def test_fstab_entry_replaced_in_place_and_other_lines_kept(tmp_path):
    tab = tmp_path / "fstab"
    tab.write_text("# static\nUUID=1 / ext4 defaults 0 1\n")
    line = fstab.entry("u1", "/mnt/hot", "xfs", ["noatime", "nofail"])
    fstab.set_entry(tab, "hot", line, "u1", ["/mnt/hot"])
    fstab.set_entry(tab, "hot", line.replace("noatime,", ""), "u1", ["/mnt/hot"])
    assert tab.read_text() == ("# static\nUUID=1 / ext4 defaults 0 1\n# hotcache:hot\n"
                               "UUID=u1 /mnt/hot xfs nofail 0 0\n")
    fstab.set_entry(tab, "hot", None, "u1", ["/mnt/hot"])
    assert tab.read_text() == "# static\nUUID=1 / ext4 defaults 0 1\n"


def test_fstab_escapes_spaces_in_mountpoints():
    assert "/mnt/my\\040data" in fstab.entry("u", "/mnt/my data", "xfs", ["noatime"])


@pytest.mark.parametrize("text,expected", [("512M", 512 * 2**20), ("2G", 2 * 2**30),
                                           ("1GiB", 2**30), ("1.5T", int(1.5 * 2**40)),
                                           (4096, 4096)])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "G", "-1G", 0, True, "2 apples"])
def test_bad_sizes(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_published_schema_is_current_and_examples_validate():
    published = json.loads((ROOT / "examples" / "hotcache-spec.schema.json").read_text())
    assert published == json_schema(), "run `hotcache schema > examples/hotcache-spec.schema.json`"
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(example.read_text()), published)
        load_spec(example)


def test_schema_rejects_unknown_keys_like_the_cli():
    doc = {"caches": [{"name": "a", "backend": "none", "origin": "/dev/x", "oops": 1,
                       "filesystem": {"mountpoint": "/mnt/a"}}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, json_schema())


def test_root_commands_say_they_need_root(tmp_path):
    spec = ROOT / "examples" / "loop-none.yaml"
    cmd = [sys.executable, "-m", "hotcache.provision", "apply", str(spec), "--yes"]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "HOTCACHE_STATE": str(tmp_path / "m.yaml")})
    assert proc.returncode == NotRoot.exit_code == 6
    assert "must run as root" in proc.stderr and "sudo hotcache apply" in proc.stderr


def test_help_lists_commands_and_every_reporting_command_takes_json():
    out = hotcache("--help").stdout
    for command in ("devices", "plan", "apply", "status", "teardown"):
        assert command in out
    for command in ("devices", "plan", "apply", "status", "teardown"):
        assert "--json" in hotcache(command, "--help").stdout, command
