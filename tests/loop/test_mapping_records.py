"""A mapping whose entry lost one required field by hand (the file otherwise whole: its
`entries:` and `updated:` tail intact) is refused by `status` and `restore` with exit 2,
naming the file, the cache, the field and the fix; the image, fstab, mounts, loop
devices and the mapping itself are left exactly as they were (provision/records.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from hotcache.provision.errors import ExitCode
from tests.helpers import (cleanup, hotcache, loop_spec, loops_under, mounts_under,
                           sha256_file)

pytestmark = pytest.mark.root


@pytest.mark.parametrize("field", [("filesystem", "uuid"), ("devices", "origin", "node")])
def test_a_field_deleted_by_hand_is_refused_by_status_and_restore(sandbox, field):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    cleanup(sandbox)                      # "reboot": unmounted, loop device detached
    state = Path(os.environ["HOTCACHE_STATE"])
    fstab = Path(os.environ["HOTCACHE_FSTAB"])
    data = yaml.safe_load(state.read_text())
    holder = data["caches"]["hot"]
    for key in field[:-1]:
        holder = holder[key]
    del holder[field[-1]]                 # only that line goes: `entries`, `updated` stay
    state.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    assert list(data)[-2:] == ["entries", "updated"]
    before = (state.read_bytes(), fstab.read_bytes(), sha256_file(sandbox / "hot.img"))

    for command in (["status"], ["restore", "--yes"], ["apply", str(spec), "--yes"]):
        proc = hotcache(*command)
        assert proc.returncode == ExitCode.BAD_INPUT, (command, proc.stdout, proc.stderr)
        said = " ".join(proc.stderr.split())
        assert str(state) in said and "cache hot" in said, said
        assert f"caches.hot.{'.'.join(field)}: is missing" in said, said
        assert "put the field back" in said and "Traceback" not in proc.stderr
    assert (state.read_bytes(), fstab.read_bytes(), sha256_file(sandbox / "hot.img")) == before
    assert loops_under(sandbox) == [] and mounts_under(sandbox) == []


def test_the_mapping_a_real_apply_wrote_saves_back_unchanged(sandbox):
    """Typed records change nothing in the file: what apply and `hotcache copy` wrote
    loads and saves back line for line (only `updated:` moves on)."""
    from hotcache.provision import mapping
    from hotcache.provision.hotcopy.catalog import RECORDED
    from tests.unit.hotcopy.test_copy import make_dataset

    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    hotcache("copy", make_dataset(sandbox / "src", n=2), sandbox / "mnt" / "hot" / "pets",
             check=True)
    state = Path(os.environ["HOTCACHE_STATE"])
    before = state.read_text()
    # The keys, their order and their nulls, as hotcache wrote them before the records.
    entry = yaml.safe_load(before)["caches"]["hot"]
    assert list(entry) == ["backend", "state", "created", "updated", "mode", "writeback_ever",
                           "tunables",
                           "devices", "cached_device", "filesystem", "persist",
                           "backend_state", "hot_copies", "spec"]
    assert list(entry["devices"]["origin"]) == ["node", "size", "by_id", "identity", "loop_file"]
    assert entry["filesystem"] == {**entry["filesystem"], "owner": None, "mode": None}
    assert list(entry["filesystem"]) == ["type", "uuid", "label", "mountpoint", "options",
                                         "owner", "mode"]
    (copy,) = entry["hot_copies"].values()
    assert list(copy) == [*RECORDED, "dev", "inode", "uid"] and copy["verified_at"] is None
    published = os.lstat(sandbox / "mnt" / "hot" / "pets")
    assert (copy["dev"], copy["inode"], copy["uid"]) == (published.st_dev, published.st_ino,
                                                         published.st_uid)
    with mapping.editing(state):
        pass
    after = state.read_text()

    def body(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("updated:")]
    assert body(after) == body(before)
