"""One backend registry (backends/__init__.BACKENDS): every fact about a backend is
declared on its class, and spec validation, restore, doctor and warm read it there."""

from __future__ import annotations

import pytest
import yaml

from hotcache.provision.backends import BACKENDS
from hotcache.provision.backends.dmcache import DmCache
from hotcache.provision.engine import restore
from hotcache.provision.engine.spec import HostSpec, parse_spec
from hotcache.provision.errors import SpecError
from hotcache.provision.observe import doctor
from hotcache.provision.system.runner import Result, Runner


def test_every_backend_declares_its_facts():
    assert list(BACKENDS) == ["none", "bcache", "dm-cache", "lvmcache"]
    for name, backend in BACKENDS.items():
        assert backend.name == name and backend.modes and backend.default_mode() in backend.modes
        assert all(t in (int, str) for t in backend.tunables.values())
        assert bool(backend.kernel_feature) == backend.block_cache == backend.restores_at_boot
        assert bool(backend.modules) == backend.block_cache


def spec(mode: str, **tunables) -> dict:
    return {"caches": [{"name": "c1", "backend": "dm-cache", "mode": mode, "tunables": tunables,
                        "origin": "/dev/null", "cache": "/dev/zero",
                        "filesystem": {"mountpoint": "/mnt/c1"}}]}


def test_spec_validation_reads_modes_and_tunables_from_the_registry(monkeypatch):
    monkeypatch.setattr(DmCache, "modes", ("writearound",))
    monkeypatch.setattr(DmCache, "tunables", {"fancy": int})
    with pytest.raises(SpecError) as err:
        parse_spec(yaml.safe_dump(spec("writeback", fancy="x")))
    problems = str(err.value)
    assert "'writeback' is not a dm-cache mode; use one of writearound" in problems
    assert "tunables.fancy: must be int" in problems
    assert HostSpec.model_validate(spec(None)).caches[0].effective_mode == "writearound"


class Modprobe(Runner):
    def run(self, argv, **kw):
        self.recorded.append([str(a) for a in argv])
        return Result(argv, 0, "", "")


def test_restore_loads_the_modules_the_registry_names(monkeypatch):
    monkeypatch.setattr(DmCache, "modules", ("dm-cache", "dm-cache-mq"))
    runner = Modprobe()
    restore._load_modules(runner, HostSpec.model_validate(spec("writeback")))
    assert runner.recorded == [["modprobe", "-a", "dm-cache", "dm-cache-mq"]]


def test_doctor_reads_kernel_features_and_restore_needs_from_the_registry():
    assert doctor.KERNEL_FEATURE == {"bcache": "bcache", "dm-cache": "device-mapper",
                                     "lvmcache": "device-mapper"}
    assert set(doctor.RESTORE_NEEDED) == {"bcache", "dm-cache"}


@pytest.mark.parametrize("name, smq", [("bcache", False), ("dm-cache", True), ("lvmcache", True)])
def test_warm_sweeps_windows_first_only_where_promotion_is_gradual(name, smq):
    assert BACKENDS[name].promotes_gradually is smq
