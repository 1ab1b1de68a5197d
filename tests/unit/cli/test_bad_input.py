"""Bad input: every case gets a message that names the input, a non-zero exit, and no
change on disk (no image file, no mapping, no fstab). Runs the real CLI."""

from __future__ import annotations

import json

import pytest

from tests.helpers import hotcache

GOOD_FS = "filesystem: {mountpoint: /mnt/hc-test}"


def spec_one(extra: str = "", origin: str = "{loop: {file: IMG, size: 1G}}",
             fs: str = GOOD_FS, backend: str = "none") -> str:
    return f"""
version: 1
caches:
  - name: hot
    backend: {backend}
    origin: {origin}
    {fs}
{extra}"""


CASES = {
    # id: (spec text, expected words in the message)
    "not-yaml": ("caches: [\n  - name: x\n bad", ["spec.yaml:2:3: not valid YAML"]),
    "not-a-mapping": ("- just\n- a list\n", ["must be a mapping"]),
    "no-caches": ("version: 1\n", ["caches: required key is missing"]),
    "unknown-key": (spec_one("    colour: blue"), ["caches[0].colour", "unknown key"]),
    "unknown-backend": (spec_one(backend="flashcache"), ["caches[0].backend"]),
    "missing-mountpoint": (spec_one(fs="filesystem: {label: x}"),
                           ["caches[0].filesystem.mountpoint", "required"]),
    "no-such-device": (spec_one(origin="/dev/sdz9"),
                       ["caches[0].origin", "/dev/sdz9 does not exist"]),
    "not-a-block-device": (spec_one(origin="/dev/null"),
                           ["caches[0].origin", "not a block device"]),
    "path-outside-dev": (spec_one(origin="/home/disk.img"), ["caches[0].origin", "/dev/"]),
    "relative-image": (spec_one(origin="{loop: {file: disk.img, size: 1G}}"),
                       ["caches[0].origin.loop.file", "absolute"]),
    "bad-size": (spec_one(origin="{loop: {file: IMG, size: 2Q}}"),
                 ["caches[0].origin.loop.size", "'2Q'"]),
    "image-folder-missing": (spec_one(origin="{loop: {file: /nonexistent/x/a.img, size: 1G}}"),
                             ["caches[0].origin.loop.file", "/nonexistent/x does not exist"]),
    "path-and-loop": (spec_one(origin="{path: /dev/null, loop: {file: IMG, size: 1G}}"),
                      ["caches[0].origin", "exactly one"]),
    "system-mountpoint": (spec_one(fs="filesystem: {mountpoint: /usr}"),
                          ["caches[0].filesystem.mountpoint", "system folder"]),
    "relative-mountpoint": (spec_one(fs="filesystem: {mountpoint: mnt/hot}"),
                            ["caches[0].filesystem.mountpoint", "absolute"]),
    "atime-option": (spec_one(fs="filesystem: {mountpoint: /mnt/hc, options: [relatime]}"),
                     ["caches[0].filesystem.options", "'relatime'", "noatime"]),
    "no-such-owner": (spec_one(fs="filesystem: {mountpoint: /mnt/hc, owner: 'nobodyhere:x'}"),
                      ["caches[0].filesystem.owner", "'nobodyhere'"]),
    "bad-mode": (spec_one(fs="filesystem: {mountpoint: /mnt/hc, mode: '999'}"),
                 ["caches[0].filesystem.mode", "octal"]),
    "long-label": (spec_one(fs="filesystem: {mountpoint: /mnt/hc, label: averyverylonglabel}"),
                   ["caches[0].filesystem.label", "12"]),
    "bad-mode-for-backend": (spec_one("    mode: writeback"), ["caches[0].mode", "none"]),
    "unknown-tunable": (spec_one("    tunables: {sequential_cutoff: 0}"),
                        ["caches[0].tunables.sequential_cutoff", "not a none tunable"]),
    "cache-needs-ssd": (spec_one(backend="bcache"), ["caches[0].cache", "needs a cache device"]),
    "bad-name": (spec_one().replace("name: hot", "name: 'hot cache!'"), ["caches[0].name"]),
    "duplicate-name": (spec_one() + """
  - name: hot
    backend: none
    origin: {loop: {file: IMG2, size: 1G}}
    filesystem: {mountpoint: /mnt/hc-other}
""", ["caches[1].name", "also the name of caches[0]"]),
    "duplicate-mountpoint": (spec_one() + """
  - name: cold
    backend: none
    origin: {loop: {file: IMG2, size: 1G}}
    filesystem: {mountpoint: /mnt/hc-test}
""", ["caches[1].filesystem.mountpoint", "also used by caches[0]"]),
    "same-device-twice": (spec_one() + """
  - name: cold
    backend: none
    origin: {loop: {file: IMG, size: 1G}}
    filesystem: {mountpoint: /mnt/hc-other}
""", ["caches[1].origin", "also used by caches[0].origin"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", ["plan", "apply"])
def test_bad_spec_is_refused_and_changes_nothing(tmp_path, case, command):
    text, words = CASES[case]
    text = text.replace("IMG2", str(tmp_path / "b.img")).replace("IMG", str(tmp_path / "a.img"))
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    env = {"HOTCACHE_STATE": str(tmp_path / "map.yaml"), "HOTCACHE_FSTAB": str(tmp_path / "fstab")}
    args = [command, spec] + (["--yes"] if command == "apply" else [])
    proc = hotcache(*args, env=env)
    assert proc.returncode == 2, proc.stderr
    assert str(spec) in proc.stderr
    for word in words:
        assert word in proc.stderr, f"{word!r} not in {proc.stderr!r}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_missing_spec_file_names_it(tmp_path):
    proc = hotcache("plan", tmp_path / "nope.yaml")
    assert proc.returncode == 2
    assert "nope.yaml" in proc.stderr and "file not found" in proc.stderr


def test_errors_are_json_with_json_flag(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_one(origin="/dev/sdz9"))
    proc = hotcache("plan", spec, "--json")
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc["error"] == "SpecError" and doc["exit_code"] == 2
    assert any("caches[0].origin" in p for p in doc["problems"])


def test_unknown_command_and_option_exit_2():
    assert hotcache("frobnicate").returncode == 2
    assert hotcache("status", "--no-such-option").returncode == 2


def test_status_of_corrupt_mapping_names_the_file(tmp_path):
    state = tmp_path / "map.yaml"
    state.write_text("caches: [unclosed\n")
    proc = hotcache("status", env={"HOTCACHE_STATE": str(state)})
    assert proc.returncode == 2 and str(state) in proc.stderr and "not valid YAML" in proc.stderr


def test_mapping_from_a_newer_hotcache_is_refused(tmp_path):
    state = tmp_path / "map.yaml"
    state.write_text("schema_version: 99\ncaches: {}\n")
    proc = hotcache("status", env={"HOTCACHE_STATE": str(state)})
    assert proc.returncode == 2 and "schema_version 99" in proc.stderr
    assert state.read_text() == "schema_version: 99\ncaches: {}\n"


def test_status_of_unknown_cache_is_bad_input(tmp_path):
    proc = hotcache("status", "nosuch", env={"HOTCACHE_STATE": str(tmp_path / "m.yaml")})
    assert proc.returncode == 2 and "'nosuch'" in proc.stderr
