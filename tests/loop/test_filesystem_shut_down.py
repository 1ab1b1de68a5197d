"""A filesystem that shut down under a mounted cache: XFS shuts itself down when a
metadata write fails (a journal write in the seconds before a failed SSD is switched
out, an origin that dies), and then answers every access with EIO while it stays
mounted. Shut down here with the kernel's own path (`xfs_io -x -c shutdown`, XFS's
XFS_IOC_GOINGDOWN) on a real XFS on a loop device."""

from __future__ import annotations

import os
import subprocess

import pytest

from hotcache.provision.observe import nodelabels
from tests.helpers import hotcache, hotcache_json, loop_spec

pytestmark = pytest.mark.root


def test_status_and_doctor_name_a_shut_down_filesystem_and_its_fix(sandbox):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    mp = sandbox / "mnt" / "hot"
    (mp / "data.bin").write_bytes(b"x" * 4096)
    os.sync()                   # on disk before the shutdown, which drops what is not
    rc, doc = hotcache_json("status")
    assert rc == 0 and doc["ok"], doc

    subprocess.run(["xfs_io", "-x", "-c", "shutdown", str(mp)], check=True)
    with pytest.raises(OSError):
        (mp / "data.bin").read_bytes()
    rc, doc = hotcache_json("status")
    (row,) = doc["caches"]
    assert rc != 0 and not doc["ok"], doc
    (found,) = [f for f in row["findings"] if f["code"] == "FILESYSTEM_SHUT_DOWN"]
    assert found["message"].startswith(f"the filesystem on {mp} shut down"), found
    assert row["mounted"], row          # still mounted: the finding says what that means
    assert not nodelabels.is_up(row), "a filesystem that answers nothing publishes nothing"

    rc, doc = hotcache_json("doctor")
    (fix,) = [f["fix"] for f in doc["findings"] if f.get("code") == "FILESYSTEM_SHUT_DOWN"]
    assert f"`umount {mp} && mount {mp}`" in fix, fix

    # the advice, followed (hotcache's fstab is the test's own): the journal is replayed
    # and the data is there again
    subprocess.run(["umount", str(mp)], check=True)
    subprocess.run(["mount", "--fstab", os.environ["HOTCACHE_FSTAB"], str(mp)], check=True)
    assert (mp / "data.bin").read_bytes() == b"x" * 4096
    rc, doc = hotcache_json("status")
    assert rc == 0 and doc["ok"], doc
    hotcache("teardown", "hot", "--yes", check=True)
