"""A device stacked on a recorded device belongs to that cache: another cache's
/dev/mapper/hc-X, /dev/bcacheN or LV named in a spec with `wipe: true` is refused.

Real loop devices stand for the SSD and for the device built on it; this host's kernel
has no device-mapper or bcache, so the one thing faked is the sysfs `holders/` link that
the kernel would make between them (the guest-kernel tier has the real ones). The spec
tries to get past the refusal with `wipe: true`; the victim's bytes stay unchanged."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from hotcache.provision import mapping
from hotcache.provision.engine import owners
from hotcache.provision.engine.apply import Env, plan_apply
from hotcache.provision.engine.spec import HostSpec
from hotcache.provision.errors import RefusedError
from hotcache.provision.system.runner import Runner
from tests.helpers import recorded_entry

pytestmark = pytest.mark.root


def attach(path) -> str:
    subprocess.run(["truncate", "-s", "64M", path], check=True)
    return subprocess.run(["losetup", "--find", "--show", path], capture_output=True,
                          text=True, check=True).stdout.strip()


def devnum(node: str) -> str:
    st = os.stat(node)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def sha(node: str) -> str:
    with open(node, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def stacked(sandbox, monkeypatch):
    """(ssd, built-on-it): the SSD cache `a` records, and a device stacked on it."""
    ssd, upper = attach(sandbox / "ssd.img"), attach(sandbox / "upper.img")
    subprocess.run(["dd", "if=/dev/urandom", f"of={upper}", "bs=1M", "count=4",
                    "status=none"], check=True)
    sysfs = sandbox / "sys-dev-block"
    holder = sysfs / devnum(ssd) / "holders"
    holder.mkdir(parents=True)
    dm = sandbox / "sys-block" / "dm-7"
    dm.mkdir(parents=True)
    (dm / "dev").write_text(devnum(upper) + "\n")
    monkeypatch.setattr(owners, "SYS_DEV_BLOCK", sysfs)
    link = sandbox / "by-id-nvme-SSD_A"
    link.symlink_to(ssd)
    state = sandbox / "state" / "mappings.yaml"
    mapping.save(state, {"caches": {"a": recorded_entry("a", backend="dm-cache", devices={
        "cache": {"node": ssd, "size": 64 * 2**20, "by_id": [str(link)]}}).copy()}})
    return ssd, upper, holder, dm, state


def spec_naming(node: str, sandbox) -> HostSpec:
    return HostSpec.model_validate({"caches": [{
        "name": "b", "backend": "none", "origin": {"path": node, "wipe": True},
        "filesystem": {"mountpoint": str(sandbox / "mnt" / "b")}}]})


def test_another_caches_stacked_device_is_refused_even_with_wipe(sandbox, stacked):
    ssd, upper, holder, dm, state = stacked
    (holder / "dm-7").symlink_to(dm)        # the kernel's link: upper is built on ssd
    before = sha(upper)
    env = Env(Runner(), state, sandbox / "fstab")
    with pytest.raises(RefusedError) as err:
        plan_apply(spec_naming(upper, sandbox), env)
    said = str(err.value)
    assert f"b.origin ({upper}) is stacked on the cache device" in said
    assert "records for cache a" in said and "`hotcache teardown a`" in said
    assert sha(upper) == before and not (sandbox / "fstab").exists()


def test_a_device_stacked_two_levels_up_is_claimed_too(sandbox, stacked):
    """An LV or bcache device on a dm table on the SSD: holders of holders."""
    ssd, upper, holder, dm, state = stacked
    middle = sandbox / "sys-block" / "dm-6"
    (middle / "holders").mkdir(parents=True)
    (middle / "dev").write_text("253:96\n")
    (holder / "dm-6").symlink_to(middle)
    mid_sys = owners.SYS_DEV_BLOCK / "253:96" / "holders"
    mid_sys.mkdir(parents=True)
    (mid_sys / "dm-7").symlink_to(dm)
    problems = owners.conflicts(spec_naming(upper, sandbox), mapping.load(state))
    assert len(problems) == 1 and "is stacked on" in problems[0]


def test_without_the_holder_link_the_device_is_no_claim(sandbox, stacked):
    """The same devices, nothing stacked: the claim is the holders, not the names."""
    ssd, upper, holder, dm, state = stacked
    assert owners.conflicts(spec_naming(upper, sandbox), mapping.load(state)) == []
