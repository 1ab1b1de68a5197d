"""bcache backend pieces that need no kernel: sizing, sysfs value parsing, and the error
a host without bcache gets (this host's kernel has none)."""

from __future__ import annotations

import pytest

from hotcache.provision.backends.parts import bcache_sysfs as sb
from hotcache.provision.backends import bcache
from hotcache.provision.engine.apply import Env, plan_apply
from hotcache.provision.errors import ExitCode, KernelUnsupported
from hotcache.provision.engine.spec import parse_spec

from tests.unit.fakehost import FakeHost


@pytest.mark.parametrize("size, bucket", [(80 * 2**20, 64 * 1024), (256 * 2**20, 256 * 1024),
                                          (2**40, 512 * 1024), (16 * 2**20, 16 * 1024)])
def test_bucket_size_gives_at_least_1024_buckets(size, bucket):
    assert bcache.bucket_size(size) == bucket
    assert size // bcache.bucket_size(size) >= bcache.MIN_BUCKETS


@pytest.mark.parametrize("text, value", [("4.0M", 4 * 2**20), ("0.0k", 0), ("0", 0),
                                         ("512", 512), ("1.5G", 3 * 2**29), ("128k", 131072)])
def test_parse_human(text, value):
    assert sb.parse_human(text) == value


def test_selected_reads_the_bracketed_choice():
    assert sb.selected("writethrough [writeback] writearound none") == "writeback"
    assert sb.selected("[lru] fifo random\n") == "lru"


def test_same_value_tolerates_bcache_rounding():
    assert sb.same_value("sequential_cutoff", "0.0k", 0)
    assert sb.same_value("sequential_cutoff", "4.0M", 4 * 2**20)
    assert not sb.same_value("sequential_cutoff", "4.0M", 0)
    assert sb.same_value("writeback_percent", "20", 20)
    assert not sb.same_value("writeback_percent", "10", 20)


def test_tunables_default_cutoff_and_congestion_off_and_spec_overrides():
    off = {"congested_read_threshold_us": 0, "congested_write_threshold_us": 0}
    assert bcache.desired_tunables({}) == {"sequential_cutoff": 0, **off}
    assert bcache.desired_tunables({"sequential_cutoff": 1 << 20, "writeback_percent": 5}) == \
        {"sequential_cutoff": 1 << 20, "writeback_percent": 5, **off}
    assert bcache.desired_tunables({"congested_read_threshold_us": 2000}) == \
        {"sequential_cutoff": 0, "congested_read_threshold_us": 2000,
         "congested_write_threshold_us": 0}


def test_cache_set_tunables_live_under_the_set(tmp_path):
    host = FakeHost(tmp_path)
    assert sb.tunable_path(host, "congested_read_threshold_us", "/dev/vdb1", "U") == \
        "/sys/fs/bcache/U/congested_read_threshold_us"
    assert sb.tunable_path(host, "sequential_cutoff", "/dev/vdb1", "U") == \
        "/sys/class/block/vdb1/bcache/sequential_cutoff"


def test_kernel_without_bcache_gets_a_clear_error(tmp_path):
    host = FakeHost(tmp_path / "host")
    host.path("/sys/fs/bcache").rmdir()        # as on this host's kernel
    spec = parse_spec(f"""
caches:
  - name: c1
    backend: bcache
    origin: {{loop: {{file: {tmp_path}/hdd.img, size: 1G}}}}
    cache: {{loop: {{file: {tmp_path}/ssd.img, size: 128M}}}}
    filesystem: {{mountpoint: {tmp_path}/mnt}}
""")
    env = Env(host.runner, tmp_path / "state.yaml", tmp_path / "fstab", host=host)
    with pytest.raises(KernelUnsupported) as err:
        plan_apply(spec, env)
    text = str(err.value)
    assert "no bcache" in text and "/sys/fs/bcache" in text
    assert "this host can use backend none, dm-cache, lvmcache" in text
    assert err.value.exit_code == ExitCode.MISSING_TOOL
    assert not (tmp_path / "hdd.img").exists() and not (tmp_path / "state.yaml").exists()
