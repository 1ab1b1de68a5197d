"""A mapping cut short at a line boundary still parses as YAML: as fewer caches, or as an
entry with fields missing. Either is an error with the fix, never "fewer caches" (read
so, every device hotcache built for the lost entries would look foreign)."""

from __future__ import annotations

import pytest

from hotcache.provision import mapping
from hotcache.provision.errors import ExitCode, UsageError


def entry(name: str) -> dict:
    return {"backend": "none", "state": "ready", "mode": None,
            "devices": {"origin": {"node": f"/dev/{name}", "size": 2**30}},
            "filesystem": {"uuid": f"uuid-{name}", "mountpoint": f"/mnt/{name}"},
            "spec": {"name": name}}


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "mappings.yaml"
    mapping.save(path, {"caches": {n: entry(n) for n in ("a", "b", "c")}})
    return path


def refused(path) -> str:
    with pytest.raises(UsageError) as err:
        mapping.load(path)
    assert err.value.exit_code == ExitCode.BAD_INPUT
    assert "backup" in str(err.value.hint)
    return str(err.value)


def test_a_saved_mapping_loads_whole(saved):
    data = mapping.load(saved)
    assert list(data["caches"]) == ["a", "b", "c"] and data["entries"] == 3
    assert list(data)[-1] == "updated"


def test_cut_after_each_entry_is_an_error_not_fewer_caches(saved):
    text = saved.read_text()
    for name in ("b", "c"):          # cut where the next entry starts: a, then a and b
        saved.write_text(text[: text.index(f"\n  {name}:\n") + 1])
        assert "cut short" in refused(saved)
    saved.write_text(text[: text.index("\nupdated:") + 1])   # only the last line lost
    assert "cut short" in refused(saved)


def test_cut_at_every_line_is_an_error(saved):
    lines = saved.read_text().splitlines(keepends=True)
    for n in range(1, len(lines)):
        saved.write_text("".join(lines[:n]))
        with pytest.raises(UsageError):
            mapping.load(saved)


def test_an_entry_cut_out_of_the_middle_is_an_error(saved):
    text = saved.read_text()
    start, end = text.index("\n  b:\n") + 1, text.index("\n  c:\n") + 1
    saved.write_text(text[:start] + text[end:])
    assert "lists 2 caches where it was written with 3" in refused(saved)


def test_the_last_entry_cut_inside_is_an_error_not_an_entry_without_fields(saved):
    text = saved.read_text()
    last = text.index("\n  c:\n")
    saved.write_text(text[: text.index("\n    spec:", last) + 1])   # c without its spec
    assert "cut short" in refused(saved)


def test_a_mapping_written_before_the_entries_count_still_loads(tmp_path):
    """Hosts upgraded from a hotcache that wrote no `entries:` line must still restore at
    boot: such a file ends with `updated:` (written last then too) and is whole."""
    import yaml

    path = tmp_path / "mappings.yaml"
    old = {"schema_version": mapping.SCHEMA_VERSION, "tool_version": "0.9",
           "caches": {n: entry(n) for n in ("a", "b")}, "updated": "2026-11-30T00:00:00Z"}
    path.write_text(yaml.safe_dump(old, sort_keys=False))
    assert list(mapping.load(path)["caches"]) == ["a", "b"]
    cut = "".join(path.read_text().splitlines(keepends=True)[:-1])   # the same, cut short
    path.write_text(cut)
    assert "cut short" in refused(path)
