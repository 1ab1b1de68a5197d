"""How the guest tier splits its cases between boot chains, checked on the host without a
guest: pytest's own collection, with each chain's -k expression, shares the listed cases
out so that each runs in exactly one chain; a merged report names a case that two chains
both ran."""

from __future__ import annotations

import subprocess
import sys

import pytest

import test_guest_kernel as tier
import vmboot


BACKEND_MODULES = ("tests/vm/guest/guest_backends.py", "tests/vm/guest/guest_reboot.py")


def collected(expression: str, modules=BACKEND_MODULES) -> set[str]:
    """The guest cases of `modules` that `pytest -k expression` selects."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-k", expression, *modules],
        cwd=vmboot.REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return {line.rsplit("/", 1)[-1] for line in done.stdout.splitlines() if "::" in line}


def test_every_backend_case_runs_in_exactly_one_chain():
    shares = {chain: collected(cases) for chain, (cases, _) in tier.BACKEND_CHAINS.items()}
    assert all(shares.values()), shares
    everything = set().union(*shares.values())
    assert everything == set(tier.IDS), sorted(everything ^ set(tier.IDS))
    assert sum(len(s) for s in shares.values()) == len(everything), shares
    # the power cut is checked in the chain whose first boot ends in it
    (cut,) = [c for c, (_, then) in tier.BACKEND_CHAINS.items() if then == "powercut.py"]
    assert "guest_reboot.py::test_hot_copies_survive_the_power_cut" in shares[cut]
    # the flush timeout reuses the partition pair of the existing-LV case, after it
    (pair,) = [s for s in shares.values()
               if "guest_backends.py::test_lvmcache_attaches_to_existing_lv" in s]
    assert "guest_backends.py::test_flush_timeout_leaves_the_dirty_cache" in pair


@pytest.mark.parametrize("module, faults", [("guest_safety.py", tier.SAFETY_FAULTS),
                                           ("guest_safety_reboot.py", tier.FAULTS_REBOOT)])
def test_every_safety_case_runs_in_exactly_one_chain(module, faults):
    """Each boot's cases are shared out between the safety chain and the fault chain."""
    where = (f"tests/vm/guest/{module}",)
    faulty, rest = collected(faults, where), collected(f"not ({faults})", where)
    listed = {case for case in tier.SAFETY_IDS if case.startswith(f"{module}::")}
    assert faulty and rest and not faulty & rest, (faulty, rest)
    assert faulty | rest == listed, sorted((faulty | rest) ^ listed)
    if module == "guest_safety_reboot.py":
        # on ssd2, which the safety chain's boots use and the fault chain's do not
        assert "guest_safety_reboot.py::test_lvmcache_failed_ssd_named_torn_down_and_a_new_" \
            "one_attached" in faulty
        return
    # the reboot checks what the fail-over case left: it stays in the chain that reboots
    assert "guest_safety.py::test_failover_keeps_the_filesystem_mounted_and_readers_reading" \
        in rest
    # and lvmcache's fail-over runs in the chain whose reboot checks it
    assert "guest_safety.py::test_lvmcache_switched_to_its_origin_is_left_so_for_the_reboot" \
        in faulty


def test_a_case_two_chains_ran_is_named():
    def report(work: str, **results) -> dict:
        return {"results": results, "problems": [], "workdir": work, "log_tail": ""}

    merged = tier.merge([report("/a", x=None, y=None), report("/b", y="failed", z=None)])
    assert merged["twice"] == ["y"]
    assert merged["results"] == {"x": None, "y": "failed", "z": None}
    assert merged["workdir"] == ["/a", "/b"]
    assert tier.merge([report("/a", x=None), report("/b", z=None)])["twice"] == []
