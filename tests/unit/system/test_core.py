"""The small pieces under the engine: runner, mapping, fstab, sizes, the published schema."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import jsonschema
import pytest
import yaml

from hotcache.provision import mapping
from hotcache.provision.system import fstab
from hotcache.provision.errors import CommandFailed, MissingProgram, NotRoot, SpecError
from hotcache.provision.system.runner import Runner, require
from hotcache.provision.engine.spec import json_schema, parse_spec, spec_size
from tests.helpers import hotcache

ROOT = Path(__file__).resolve().parents[3]


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


def entry(name: str) -> dict:
    """The fewest fields a mapping entry has (records.CacheEntry)."""
    return {"backend": "none", "state": "ready", "devices": {},
            "filesystem": {"uuid": f"uuid-{name}", "mountpoint": f"/mnt/{name}"},
            "spec": {"name": name}}


def test_mapping_roundtrip_is_atomic_and_versioned(tmp_path, monkeypatch):
    """A new mapping is a new file renamed over the old one, after its data reached the
    disk: a reader holding the old file keeps reading it whole, and an in-place rewrite
    (same inode) fails here."""
    path = tmp_path / "etc" / "mappings.yaml"
    with mapping.editing(path) as data:
        data["caches"]["a"] = entry("a")
    saved = yaml.safe_load(path.read_text())
    assert saved["schema_version"] == mapping.SCHEMA_VERSION and saved["caches"]["a"]
    assert "tool_version" in saved and "updated" in saved
    first_inode, first_text = path.stat().st_ino, path.read_text()
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append("replace") or real_replace(a, b))
    with open(path) as reader:
        with mapping.editing(path) as data:
            data["caches"]["b"] = entry("b")
        assert reader.read() == first_text             # the old file, whole
    assert path.stat().st_ino != first_inode
    assert calls == ["fsync", "replace", "fsync"]       # file data, rename, the folder
    assert set(yaml.safe_load(path.read_text())["caches"]) == {"a", "b"}
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_mapping_edits_under_the_lock_do_not_lose_updates(tmp_path):
    path = tmp_path / "m.yaml"

    def add(i):
        with mapping.editing(path) as data:
            data["caches"][f"c{i}"] = entry(f"c{i}")

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


def test_fstab_teardown_keeps_an_administrators_line_on_the_caches_mountpoint(tmp_path):
    """Only the cache's own filesystem UUID on its mountpoint is its entry: an
    administrator's line with another UUID on the same mountpoint, even right after an
    orphaned marker, survives teardown byte for byte."""
    theirs = "UUID=admin-own /mnt/hot ext4 defaults 0 2"
    assert not fstab.is_entry(theirs, "u1", ["/mnt/hot"])
    assert not fstab.is_entry("UUID= /mnt/hot xfs nofail 0 0", "u1", ["/mnt/hot"])
    assert not fstab.is_entry("UUID=u1 /mnt/hot", None, ["/mnt/hot"])
    assert not fstab.is_entry("UUID=u1 /mnt/other xfs nofail 0 0", "u1", ["/mnt/hot"])
    assert fstab.is_entry("UUID=u1 /mnt/hot/ xfs nofail 0 0", "u1", ["/mnt/hot"])
    tab = tmp_path / "fstab"
    before = f"# static\n# hotcache:hot\n{theirs}\n"
    tab.write_text(before)
    assert fstab.read_entry(tab, "hot", "u1", ["/mnt/hot"]) is None
    fstab.set_entry(tab, "hot", None, "u1", ["/mnt/hot"])
    assert tab.read_text() == f"# static\n{theirs}\n"


def test_fstab_escapes_spaces_in_mountpoints():
    assert "/mnt/my\\040data" in fstab.entry("u", "/mnt/my data", "xfs", ["noatime"])


@pytest.mark.parametrize("text,expected", [("512M", 512 * 2**20), ("2G", 2 * 2**30),
                                           ("1GiB", 2**30), ("1.5T", int(1.5 * 2**40)),
                                           (4096, 4096)])
def test_sizes(text, expected):
    assert spec_size(text) == expected


@pytest.mark.parametrize("bad", ["", "G", "-1G", 0, True, "2 apples"])
def test_bad_sizes(bad):
    with pytest.raises(ValueError):
        spec_size(bad)


def rehomed_loop_files(doc: dict, home: Path) -> dict:
    """The spec with every loop image moved into `home`: an example names a host folder
    (/var/lib/hotcache) that a fresh machine does not have, and spec validation checks
    that an image's folder exists."""
    for cache in doc.get("caches", []):
        for role in ("origin", "cache"):
            dev = cache.get(role)
            if isinstance(dev, dict) and "loop" in dev:
                dev["loop"]["file"] = str(home / Path(dev["loop"]["file"]).name)
    return doc


def test_published_schema_is_current_and_examples_validate(tmp_path):
    published = json.loads((ROOT / "examples" / "hotcache-spec.schema.json").read_text())
    assert published == json_schema(), "run `hotcache schema > examples/hotcache-spec.schema.json`"
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples
    for example in examples:
        doc = yaml.safe_load(example.read_text())
        jsonschema.validate(doc, published)
        parse_spec(yaml.safe_dump(rehomed_loop_files(doc, tmp_path)), str(example))


def readme_spec() -> dict:
    """The host spec shown in "The host spec" of docs/provisioning-and-specs.md."""
    text = (ROOT / "docs" / "provisioning-and-specs.md").read_text()
    section = text[text.index("## The host spec"):]
    block = section[section.index("```yaml") + len("```yaml"):]
    return yaml.safe_load(block[:block.index("```")])


def test_readme_spec_validates_against_the_schema_and_the_loader():
    """The docs tell editors to validate specs against the schema; their own example
    (device paths as plain strings) must pass both the schema and hotcache's loader."""
    doc = readme_spec()
    assert isinstance(doc["caches"][0]["origin"], str)
    jsonschema.validate(doc, json_schema())
    with pytest.raises(SpecError) as info:    # the devices are not on this host
        parse_spec(yaml.safe_dump(doc))
    assert all("does not exist" in p or "user" in p or "group" in p
               for p in info.value.problems), info.value.problems


def test_schema_command_prints_the_published_schema():
    proc = hotcache("schema", check=True)
    printed = json.loads(proc.stdout)
    assert printed == json_schema()
    assert printed == json.loads((ROOT / "examples" / "hotcache-spec.schema.json").read_text())
    # it is a usable schema: it accepts a minimal spec and names what a bad one lacks
    jsonschema.validate({"version": 1, "caches": [{"name": "a", "backend": "none",
                         "origin": "/dev/x", "filesystem": {"mountpoint": "/mnt/a"}}]}, printed)
    with pytest.raises(jsonschema.ValidationError):    # not a device path
        jsonschema.validate({"version": 1, "caches": [{"name": "a", "backend": "none",
                             "origin": "sdb", "filesystem": {"mountpoint": "/mnt/a"}}]}, printed)
    with pytest.raises(jsonschema.ValidationError, match="backend"):
        jsonschema.validate({"version": 1, "caches": [{"name": "a", "origin": "/dev/x",
                             "filesystem": {"mountpoint": "/mnt/a"}}]}, printed)


def test_schema_rejects_unknown_keys_like_the_cli():
    doc = {"caches": [{"name": "a", "backend": "none", "origin": "/dev/x", "oops": 1,
                       "filesystem": {"mountpoint": "/mnt/a"}}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, json_schema())


@pytest.mark.parametrize("argv", [["apply", "SPEC", "--yes"], ["plan", "SPEC"],
                                  ["teardown", "demo", "--yes"], ["restore", "--yes"]])
def test_root_commands_say_they_need_root(tmp_path, monkeypatch, capsys, argv):
    """The check runs in this process as a non-root uid, wherever the checkout lies (a
    subprocess as `nobody` cannot start a venv under root's home), through main(), the
    console script's own entry point, so the exit code is the one a user sees."""
    from hotcache.provision import cli     # the console script's `hotcache.provision.cli:main`

    spec = tmp_path / "spec.yaml"
    spec.write_text("version: 1\ncaches: []\n")
    state = tmp_path / "m.yaml"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sys, "argv", ["hotcache", *[str(spec) if a == "SPEC" else a
                                                    for a in argv], "--state", str(state)])
    with pytest.raises(SystemExit) as info:
        cli.main()
    err = capsys.readouterr().err
    assert info.value.code == NotRoot.exit_code == 6, err
    assert "must run as root" in err and f"sudo hotcache {argv[0]}" in err
    assert not state.exists()


def test_help_lists_commands_and_every_reporting_command_takes_json():
    out = hotcache("--help").stdout
    for command in ("devices", "plan", "apply", "status", "teardown"):
        assert command in out
    for command in ("devices", "plan", "apply", "status", "teardown"):
        assert "--json" in hotcache(command, "--help").stdout, command


def test_readme_test_commands_fail_on_skips_like_ci(tmp_path):
    """Every pytest command the README and the docs give (inline or in a code block) sets
    HOTCACHE_FAIL_ON_SKIP=1, as .ci/run does, and with it a skipped test fails the run (a
    missing torch must not pass quietly)."""
    import re
    import subprocess

    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "tests" / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
    commands = []
    for page in pages:
        text = page.read_text()
        commands += re.findall(r"`([^`\n]*-m pytest[^`\n]*)`", text)
        commands += [line for line in text.splitlines()
                     if "-m pytest" in line and not line.lstrip().startswith("`")]
    assert len(commands) >= 5, commands
    for command in commands:
        assert "HOTCACHE_FAIL_ON_SKIP=1" in command.split(), command
    assert "HOTCACHE_FAIL_ON_SKIP=1" in (ROOT / ".ci" / "run").read_text()
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\ndef test_needs_something():\n    pytest.importorskip('no_such_module')\n")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
            "--rootdir", str(tmp_path), str(tmp_path / "test_skips.py")]
    env = {k: v for k, v in os.environ.items() if k != "HOTCACHE_FAIL_ON_SKIP"}
    quiet = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env)
    strict = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                            env={**env, "HOTCACHE_FAIL_ON_SKIP": "1"})
    assert quiet.returncode == 0, quiet.stdout
    assert strict.returncode != 0 and "forbids skips" in strict.stdout, strict.stdout
