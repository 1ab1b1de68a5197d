"""A bcache whose origin failed badly enough that the kernel stopped its bcache device
(bch_cached_dev_error: too many I/O errors on the backing device) and unregistered the
backing device. Its dirty data waits in the cache set; the stopped device's node stays,
and cannot be opened, until nothing holds it. Restore must get from there to a running
cache (the path teardown's "restore, then teardown" points at), never probing the node
that cannot be read; a dead mount of it is unmounted first, or refused while in use."""

from __future__ import annotations

import pytest
import yaml

from hotcache.provision import mapping
from hotcache.provision.backends import bcache
from hotcache.provision.block import busy
from hotcache.provision.engine.restore import plan_restore
from hotcache.provision.engine.teardown import plan_teardown
from hotcache.provision.errors import RefusedError, WaitTimeout

from tests.unit.backends.test_plans import (BRING_UP, BY_UUID, HDD_MIB, MKDIR, MP, READY,
                                            bcache_built, checked, fake, mount,  # noqa: F401
                                            plan, steps)

WAIT = ("wait for the kernel to let go of the stopped device /dev/bcache0 (the cache set "
        "keeps its dirty data)")


def stopped_device(fake, *, mounted: bool = False) -> None:
    """The recorded bcache, its backing device unregistered, and bcache0 still there: its
    node and by-uuid link exist, but it cannot be opened (blkid exits 2, as on a real
    host where the open fails with ENXIO)."""
    bcache_built(fake, registered=False)
    fake.disk("bcache0", None, HDD_MIB)
    del fake.disks["bcache0"]
    fake.link(BY_UUID, "/dev/bcache0")
    if mounted:
        fake.mount("/dev/bcache0", MP, "noatime", "nosuid", "nodev")


def test_restore_waits_for_the_stopped_device_then_registers_it_again(fake):
    stopped_device(fake)
    assert steps(plan_restore(fake.env_)) == [
        WAIT, *BRING_UP, checked(BY_UUID), MKDIR, mount(BY_UUID), READY]


def test_a_dead_mount_of_the_stopped_device_is_unmounted_first(fake):
    stopped_device(fake, mounted=True)
    plan = plan_restore(fake.env_)
    assert steps(plan) == [["umount", MP], WAIT, *BRING_UP, checked(BY_UUID), MKDIR,
                           mount(BY_UUID), READY]
    assert "the kernel stopped its device /dev/bcache0" in plan.steps[0].summary


def test_a_dead_mount_in_use_is_refused_naming_the_processes(fake, monkeypatch):
    stopped_device(fake, mounted=True)
    monkeypatch.setattr(busy, "users_of", lambda mp: ["pid 4242 (python3): cwd"])
    with pytest.raises(RefusedError) as err:
        plan_restore(fake.env_)
    said = str(err.value)
    assert "the kernel stopped its bcache device /dev/bcache0" in said
    assert f"{MP} is mounted from it" in said and "in use" in said
    assert "pid 4242 (python3): cwd" in said and "stop those processes" in said
    assert "choose another mountpoint" not in said      # one refusal, the cause


def test_teardown_names_the_stopped_device_and_points_at_restore(fake):
    stopped_device(fake)
    with pytest.raises(RefusedError) as err:
        plan_teardown("c1", fake.env_)
    assert "the kernel stopped /dev/bcache0 after I/O errors on it" in str(err.value)
    assert "`hotcache restore c1`, then `hotcache teardown c1`" in err.value.hint


def test_a_registered_backing_device_is_never_taken_for_a_stopped_one(fake):
    bcache_built(fake)
    assert bcache.stopping_node(fake, "44444444-4444-4444-8444-444444444444",
                                "/dev/vdb") is None


def test_the_wait_ends_when_the_node_goes_and_says_what_to_check_when_it_does_not(
        fake, monkeypatch):
    stopped_device(fake)
    monkeypatch.setattr(bcache, "REGISTER_TIMEOUT", 0.2)
    with pytest.raises(WaitTimeout) as err:
        bcache.wait_stopped(fake, "/dev/bcache0")
    assert "/dev/bcache0" in str(err.value) and "origin answers again" in err.value.hint
    fake.path("/dev/bcache0").unlink()
    bcache.wait_stopped(fake, "/dev/bcache0")


def test_a_running_device_that_took_the_number_is_never_unmounted(fake):
    """Once ours is gone, another cache's device can take bcache0 before udev moves the
    by-uuid link: it runs (its bcache folder resolves), so it is never taken for ours."""
    stopped_device(fake, mounted=True)
    fake.sysfs_file("/sys/class/block/bcache0/bcache/state", "clean")
    assert bcache.stopping_node(fake, "44444444-4444-4444-8444-444444444444",
                                "/dev/vdb") is None
    with pytest.raises(RefusedError, match="shows no filesystem"):   # not ours: refused
        plan_restore(fake.env_)


def test_a_cache_whose_first_apply_did_not_finish_is_refused_never_formatted(fake):
    """Whether its filesystem was made is not known: the way back is said, nothing else."""
    stopped_device(fake, mounted=True)
    data = yaml.safe_load(fake.env_.state.read_text())
    data["caches"]["c1"]["state"] = "building"
    mapping.save(fake.env_.state, data)
    with pytest.raises(RefusedError) as err:
        plan(fake, "bcache")
    said = str(err.value)
    assert "before its first apply finished" in said and "mkfs" not in said


def test_a_mount_over_the_dead_one_is_never_unmounted(fake, tmp_path):
    stopped_device(fake, mounted=True)
    fake.disk("vdz", None, 64, type="ext4", uuid="other")
    fake.mount("/dev/vdz", MP)                 # mounted over the dead mount
    with pytest.raises(RefusedError) as err:
        plan_restore(fake.env_)
    assert "which is mounted over it: unmount that first" in str(err.value)


def test_the_unmount_stops_if_the_top_mount_changed_since_the_plan(fake):
    from hotcache.provision.plan import RunContext

    stopped_device(fake, mounted=True)
    umount = plan_restore(fake.env_).steps[0]
    assert umount.argv == ["umount", MP]
    umount.check(RunContext(fake.runner))           # as planned: goes ahead
    fake.disk("vdz", None, 64, type="ext4", uuid="other")
    fake.mount("/dev/vdz", MP)
    with pytest.raises(RefusedError, match="no longer mounted from /dev/bcache0 on top"):
        umount.check(RunContext(fake.runner))


def test_another_mount_namespace_holding_it_is_refused_naming_it(fake, monkeypatch):
    stopped_device(fake, mounted=True)
    monkeypatch.setattr(busy, "other_namespaces_holding", lambda devnum: ["pid 77 (pause)"])
    with pytest.raises(RefusedError) as err:
        plan_restore(fake.env_)
    assert "other mount namespaces still hold" in str(err.value)
    assert "pid 77 (pause)" in str(err.value)


def test_a_dead_mount_at_the_old_mountpoint_is_unmounted_once(fake):
    """The spec moved the mountpoint since: the dead mount at the old one is unmounted by
    the release, never a second time by the move."""
    stopped_device(fake)
    data = yaml.safe_load(fake.env_.state.read_text())
    data["caches"]["c1"]["filesystem"]["mountpoint"] = "/mnt/old"
    mapping.save(fake.env_.state, data)
    fake.mount("/dev/bcache0", "/mnt/old", "noatime")
    unmounts = [s for s in plan(fake, "bcache") if s[:1] == ["umount"]]
    assert unmounts == [["umount", "/mnt/old"]]
