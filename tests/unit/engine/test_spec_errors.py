"""A host spec's problems all at once, each at its file:line:col, with a hint for each of
YAML's traps; the schema editors read carries the static rules; `-` reads the spec from
standard input."""

from __future__ import annotations

import io
import json
import os
import sys
import textwrap

import jsonschema
import pytest

from hotcache.provision.engine.spec import json_schema, load_spec, parse_spec
from hotcache.provision.errors import SpecError
from tests.helpers import hotcache

# One cache, five mistakes: two the model refuses, three only the checks of the host see.
FIVE = """\
version: 1
caches:
  - name: hot
    backend: none
    colour: blue
    mode: writeback
    origin: /dev/sdz9
    filesystem:
      mountpoint: /usr
      mode: 0755
"""


def problems(text: str, source: str = "spec.yaml") -> list[str]:
    with pytest.raises(SpecError) as err:
        parse_spec(textwrap.dedent(text), source)
    return [line.strip() for line in str(err.value).splitlines()[1:-1]]


def test_five_mistakes_are_five_problems_each_at_its_line_and_column():
    assert problems(FIVE) == [
        "spec.yaml:5:5: caches[0].colour: unknown key (check its spelling; see `hotcache "
        "schema`)",
        "spec.yaml:6:11: caches[0].mode: 'writeback' is not a none mode; use one of none",
        "spec.yaml:7:13: caches[0].origin: device /dev/sdz9 does not exist (see `hotcache "
        "devices`)",
        "spec.yaml:9:19: caches[0].filesystem.mountpoint: /usr is a system folder; mount the "
        "cache on its own folder such as /mnt/hot",
        "spec.yaml:10:13: caches[0].filesystem.mode: Input should be a valid string; YAML "
        "reads an unquoted 0755 as the octal number 493: write it in quotes, '0755'",
    ]


def test_the_cli_reports_the_five_at_once_and_changes_nothing(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(FIVE)
    env = {"HOTCACHE_STATE": str(tmp_path / "m.yaml"), "HOTCACHE_FSTAB": str(tmp_path / "f")}
    proc = hotcache("plan", spec, env=env)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[0] == f"hotcache: {spec}: invalid host spec (5 problems)"
    assert [ln.split(": ")[0] for ln in lines[1:6]] == [
        f"  {spec}:{at}" for at in ("5:5", "6:11", "7:13", "9:19", "10:13")]
    assert lines[6] == "  next: fix these and run `hotcache plan` again"
    doc = json.loads(hotcache("plan", spec, "--json", env=env).stdout)
    assert len(doc["problems"]) == 5 and doc["problems"][0].startswith("caches[0].colour: ")
    assert doc["locations"][0] == {"line": 5, "column": 5}
    assert [p["line"] for p in doc["locations"]] == [5, 6, 7, 9, 10]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def spec_with(fs: str = "", cache: str = "") -> str:
    return ("version: 1\ncaches:\n  - name: hot\n    backend: dm-cache\n"
            "    origin: /dev/sdz8\n    cache: /dev/sdz9\n" + cache +
            "    filesystem:\n      mountpoint: /mnt/hot\n" + fs)


@pytest.mark.parametrize("text, where, words", [
    (spec_with(fs="      mode: 0755\n"), "spec.yaml:9:13: caches[0].filesystem.mode",
     ["the octal number 493", "'0755'"]),
    (spec_with(fs="      mode: 775\n"), "spec.yaml:9:13: caches[0].filesystem.mode",
     ["the number 775", "'775'"]),
    (spec_with(fs="      label: yes\n"), "spec.yaml:9:14: caches[0].filesystem.label",
     ["the boolean true", "yes/no/on/off", "'yes'"]),
    (spec_with(fs="      persist: off\n"), "spec.yaml:9:16: caches[0].filesystem.persist",
     ["Input should be 'fstab' or 'none'", "the boolean false", "'off'"]),
    (spec_with(cache="    tunables: {policy: on}\n"), "spec.yaml:7:24: caches[0].tunables.policy",
     ["must be str", "the boolean true", "'on'"]),
    (spec_with().replace("/mnt/hot", ""), "spec.yaml:8:18: caches[0].filesystem.mountpoint",
     ["the value is empty, which YAML reads as null: give one"]),
])
def test_each_of_yamls_traps_gets_its_hint(text, where, words):
    found = [p for p in problems(text) if not p.startswith(("spec.yaml:5:", "spec.yaml:6:"))]
    assert len(found) == 1 and found[0].startswith(where + ": "), found
    for word in words:
        assert word in found[0], found[0]


def test_a_quoted_value_or_a_number_where_one_belongs_gets_no_hint():
    found = problems(spec_with(fs="      mode: '999'\n      device_timeout: 0\n"))
    assert [p.split(": ")[1] for p in found[2:]] == ["caches[0].filesystem.mode",
                                                     "caches[0].filesystem.device_timeout"]
    assert not any("YAML reads" in p for p in found)


def test_a_tab_that_indents_is_named():
    with pytest.raises(SpecError) as err:
        parse_spec("version: 1\ncaches:\n\t- name: hot\n", "spec.yaml")
    assert err.value.problems[0].startswith("not valid YAML")
    assert err.value.locations == [(3, 1)]
    assert err.value.hint == "YAML does not allow tabs for indentation: indent with spaces"
    with pytest.raises(SpecError) as err:       # a syntax error of another kind
        parse_spec("caches: [\n", "spec.yaml")
    assert "tabs" not in str(err.value)


def test_a_key_given_twice_is_a_problem_at_the_second():
    text = spec_with(fs="      mountpoint: /mnt/other\n")
    found = problems(text)
    assert "spec.yaml:9:7: caches[0].filesystem.mountpoint: given twice (first on line 8); " \
           "YAML keeps only the last: remove one" in found


def test_a_structural_error_does_not_hide_the_other_caches_or_keys():
    """Salvage: a cache whose `cache` device has an unknown key is not told it lacks one,
    the rest of that device is checked, and a second cache is checked in full."""
    text = spec_with(fs="      label: waytoolongforxfs\n").replace(
        "    cache: /dev/sdz9\n", "    cache: {path: /dev/sdz9, size: 1}\n") + \
        "  - name: hot\n    backend: none\n    origin: /dev/sdz7\n" \
        "    filesystem: {mountpoint: /mnt/hot}\n"
    assert [p.split(": ")[1] for p in problems(text)] == [
        "caches[0].origin", "caches[0].cache", "caches[0].cache.size",
        "caches[0].filesystem.label", "caches[1].name", "caches[1].origin",
        "caches[1].filesystem.mountpoint"]


def test_the_schema_carries_the_mode_enum_the_name_pattern_and_each_backends_rules():
    schema = json_schema()
    cache = schema["$defs"]["CacheSpec"]
    assert cache["properties"]["name"]["pattern"] == "^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$"
    assert cache["properties"]["mode"]["anyOf"][0]["enum"] == [
        "none", "passthrough", "writearound", "writeback", "writethrough"]
    assert schema["$defs"]["Filesystem"]["properties"]["mode"]["anyOf"][0]["pattern"] == \
        "^0?[0-7]{3,4}$"
    jsonschema.Draft202012Validator.check_schema(schema)

    def errors(**cache):
        doc = {"version": 1, "caches": [{"name": "a", "backend": "dm-cache", "origin": "/dev/x",
                                         "cache": "/dev/y", "filesystem": {"mountpoint": "/m"},
                                         **cache}]}
        return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
    assert errors(mode="passthrough", tunables={"policy": "smq"}) == []
    assert errors(mode="writearound")                   # a bcache mode
    assert errors(tunables={"sequential_cutoff": 0})    # a bcache tunable
    assert errors(name="hot cache!")
    assert errors(backend="none")                       # none takes no cache device
    assert errors(backend="bcache", cache=None) and errors(filesystem={"mountpoint": "/m",
                                                                       "mode": 493})


def test_a_dash_reads_the_spec_from_stdin(monkeypatch, tmp_path):
    text = spec_with().replace("/dev/sdz8", "{loop: {file: " + str(tmp_path / "a.img") +
                               ", size: 1G}}").replace("dm-cache", "none").replace(
                                   "    cache: /dev/sdz9\n", "")
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    assert load_spec("-") == parse_spec(text)
    monkeypatch.setattr(sys, "stdin", io.StringIO(FIVE))
    with pytest.raises(SpecError) as err:
        load_spec("-")
    assert str(err.value).splitlines()[1].startswith("  <stdin>:5:5: caches[0].colour")


@pytest.mark.parametrize("command", [["plan"], ["apply", "--yes"]])
def test_plan_and_apply_dash_read_stdin_and_name_it(tmp_path, command):
    env = {"HOTCACHE_STATE": str(tmp_path / "m.yaml"), "HOTCACHE_FSTAB": str(tmp_path / "f")}
    proc = hotcache(command[0], "-", *command[1:], input=FIVE, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("hotcache: <stdin>: invalid host spec (5 problems)\n"
                                  "  <stdin>:5:5: caches[0].colour: unknown key")
    assert "file not found" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    proc = hotcache(command[0], "-", *command[1:], input="", env=env)
    assert proc.returncode == 2 and "<stdin>: invalid host spec\n  (top level): the spec " \
        "is empty" in proc.stderr


def test_plan_dash_plans_a_good_spec_from_stdin(tmp_path):
    text = f"""version: 1
caches:
  - name: hot
    backend: none
    origin: {{loop: {{file: {tmp_path}/hot.img, size: 1G}}}}
    filesystem: {{mountpoint: {tmp_path}/mnt/hot}}
"""
    env = {"HOTCACHE_STATE": str(tmp_path / "m.yaml"), "HOTCACHE_FSTAB": str(tmp_path / "f")}
    proc = hotcache("plan", "-", "--json", input=text, env=env)
    if os.geteuid() != 0:   # the spec was read and is valid: the root check comes next
        assert proc.returncode == 6 and "must run as root" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "plan" and any(s["cache"] == "hot" for s in doc["steps"])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_value_both_sides_of_a_union_refuse_is_one_problem_at_its_own_path():
    found = problems(spec_with().replace("/dev/sdz8", "{loop: {file: /tmp/a.img, size: [1]}}"))
    assert found[0] == ("spec.yaml:5:45: caches[0].origin.loop.size: Input should be a valid "
                        "integer or a valid string")


def test_a_cache_device_the_model_refuses_is_not_also_missing():
    found = problems(spec_with().replace("cache: /dev/sdz9", "cache: {loop: {file: x.img}}"))
    assert [p.split(": ", 2)[1:] for p in found[1:]] == [
        ["caches[0].cache.loop.size", "required key is missing"],
        ["caches[0].cache.loop.file", "loop image file 'x.img' must be an absolute path"]]


@pytest.mark.parametrize("backend, cache, problem", [
    ("dm-cache", "null", "backend dm-cache needs a cache device (the SSD)"),
    ("none", "null", None),
    ("none", "/dev/sdz9", "backend none puts XFS straight on `origin`"),
])
def test_a_cache_device_given_as_null_is_none_given(backend, cache, problem):
    text = spec_with(cache="    colour: x\n").replace("dm-cache", backend).replace(
        "cache: /dev/sdz9", f"cache: {cache}")
    for spec in (text, text.replace("    colour: x\n", "")):     # salvaged, and whole
        found = [p for p in problems(spec) if "caches[0].cache: backend" in p]
        assert [problem in p for p in found] == ([True] if problem else []), found
