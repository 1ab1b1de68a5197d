"""The real-kernel tier: boot the stock Debian kernel under QEMU (TCG, via virtme-ng)
with virtio disks (an "SSD", an "HDD", ...), run the guest tests inside it with the
project's venv, and report every guest case here, one host test each.

Four chains of boots, side by side, each on fresh sparse images of its own:
- the backends: guest/guest_backends.py, then a reboot into guest/guest_reboot.py. Its
  cases run in two chains: lvmcache's (the slowest) and the flush timeout in one,
  bcache's, dm-cache's and the power cut during hot copies (guest/powercut.py, after the
  first boot) in the other;
- storage safety: guest/guest_safety.py, then guest/guest_safety_reboot.py with the disks
  in another order; its fault cases in a chain of their own (lvmcache's fail-over with
  its reboot, which also runs lvmcache's failed SSD).
A guest that cannot boot fails these tests; it never skips them.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

import vmboot
from cases import (BACKENDS, BOOT1, BOOT1_ONCE, BOOT2, BOOT2_ONCE, BYSTANDER_MIB, HDD_MIB,
                   SAFETY_BOOT1, SAFETY_BOOT2, SAFETY_ORDERS, SSD2_MIB, SSD_MIB)

pytestmark = pytest.mark.vm
REPO, VENV = vmboot.REPO, vmboot.VENV
# A boot under TCG on a 2-core machine that other work also loads took 8 minutes to
# reach pytest, and boot 1 with every case then the power cut ran 28 minutes beside another
# guest: a hung guest is stopped, a slow one is not.
BOOT_TIMEOUT = int(os.environ.get("HOTCACHE_VM_BOOT_TIMEOUT", "3600"))


def kernel() -> str:
    found = vmboot.kernel()
    if found is None:
        pytest.fail("no /boot/vmlinuz-*-amd64: install linux-image-amd64 (.ci/install)")
    return found


def boot(workdir: Path, guest_module: str, report: str, then: str = "",
         disks: tuple[str, ...] | None = None, cases: str = "") -> tuple[int, str]:
    """One guest boot running pytest on `guest_module`, then the guest script `then`
    (its output in OUT/<script>.log); returns (status, console log). `disks`: image
    names in workdir, in the order they become vda, vdb... (serial = name); default the
    ssd and hdd pair. `cases`: a pytest -k expression, the chain's share of the module."""
    out = workdir / "out"
    persist = out / "persist"
    persist.mkdir(parents=True, exist_ok=True)
    python = VENV / "bin" / "python"
    # HOTCACHE_VM_K: develop one case, a short boot
    select = " and ".join(f"({k})" for k in (cases, os.environ.get("HOTCACHE_VM_K")) if k)
    pick = f"-k {shlex.quote(select)} " if select else ""
    # HOTCACHE_VM_TRACE=1: each guest command timed, in OUT/<report>.trace
    trace = f"HOTCACHE_VM_TRACE={out / (report + '.trace')} " \
        if os.environ.get("HOTCACHE_VM_TRACE") else ""
    # No plugin autoloading: the host's second install may be adding packages to the
    # venv (a pytest plugin's entry point before its module) while a guest starts.
    command = (f"cd {REPO} && {trace}HOTCACHE_VM_PERSIST={persist} PYTHONDONTWRITEBYTECODE=1 "
               "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "
               f"{python} -m pytest -p no:cacheprovider -q --tb=short {pick}"
               f"-o junit_family=xunit1 --junitxml={out / report} "
               f"tests/vm/guest/{guest_module} > {out / (report + '.log')} 2>&1; "
               f"echo guest-pytest-exit=$?")
    if then:
        command += (f"; HOTCACHE_VM_PERSIST={persist} PYTHONDONTWRITEBYTECODE=1 {python} "
                    f"tests/vm/guest/{then} > {out / (Path(then).stem + '.log')} 2>&1")
    kernel()
    drives = vmboot.drives(workdir) if disks is None else " ".join(
        f"-drive if=none,id={d},file={workdir / (d + '.img')},format=raw,cache=unsafe "
        f"-device virtio-blk-pci,drive={d},serial={d}" for d in disks)
    proc = vmboot.boot(command, out, drives, BOOT_TIMEOUT)
    (workdir / f"{report}.console").write_text(proc.stdout)
    return proc.returncode, proc.stdout


def results(xml: Path) -> dict[str, str | None]:
    """test id ('guest_backends.py::test_apply[bcache]') -> None (passed) or the failure."""
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skipped = case.find("skipped")
        msg = None
        if bad is not None:
            msg = (bad.get("message") or "") + "\n" + (bad.text or "")
        elif skipped is not None:
            msg = "skipped in the guest: " + (skipped.get("message") or "")
        out[f"{module}.py::{case.get('name')}"] = msg
    return out


def backend_boots(work: Path, cases: str, then: str = "") -> dict:
    """The backends boot (then the guest script `then`), then the reboot, on one
    ssd/hdd pair, running the cases that the -k expression `cases` selects."""
    for name, mib in (("ssd", SSD_MIB), ("hdd", HDD_MIB)):
        with open(work / f"{name}.img", "wb") as f:
            f.truncate(mib * 2**20)
    return run_boots(work, [("guest_backends.py", "boot1.xml", then, None, cases),
                            ("guest_reboot.py", "boot2.xml", "", None, cases)])


# Storage safety's cases that fail a device, in a chain of their own so that the safety
# chain's two boots are not the tier's long pole: those that clean up after themselves,
# and lvmcache's fail-over, whose reboot (FAULTS_REBOOT) is that chain's second boot.
# (dm-cache's fail-over stays: the safety chain's reboot checks what it left.) That
# second boot also runs lvmcache's failed SSD on ssd2, which no case of the chain uses
# before it.
SAFETY_FAULTS = ("failing_during_teardown or failed_ssd_named or failed_writeback or "
                 "lvmcache_switched")
FAULTS_REBOOT = "lvmcache_on_its_origin or lvmcache_failed_ssd_named"


def safety_images(work: Path) -> None:
    """Four disks: ssd, hdd, ssd2, a bystander."""
    for name, mib in (("ssd", SSD_MIB), ("hdd", HDD_MIB), ("by", BYSTANDER_MIB),
                      ("ssd2", SSD2_MIB)):
        with open(work / f"{name}.img", "wb") as f:
            f.truncate(mib * 2**20)


def safety_boots(work: Path) -> dict:
    """Storage safety but its fault cases, on four disks given in another order the
    second time, so that kernel names move."""
    safety_images(work)
    return run_boots(work, [
        ("guest_safety.py", "safety1.xml", "", SAFETY_ORDERS[0], f"not ({SAFETY_FAULTS})"),
        ("guest_safety_reboot.py", "safety2.xml", "", SAFETY_ORDERS[1],
         f"not ({FAULTS_REBOOT})")])


def fault_boots(work: Path) -> dict:
    """Storage safety's fault cases on disks of their own, then the reboot that checks
    lvmcache's fail-over."""
    safety_images(work)
    return run_boots(work, [
        ("guest_safety.py", "faults.xml", "", SAFETY_ORDERS[0], SAFETY_FAULTS),
        ("guest_safety_reboot.py", "faults2.xml", "", SAFETY_ORDERS[1], FAULTS_REBOOT)])


# The backends' cases in two chains of about the same length: lvmcache's (its
# parametrized cases and those named after it) with the flush timeout, which reuses the
# partitions of the existing-LV case before it, and bcache's and dm-cache's with the power
# cut. chain -> (-k expression, guest script after the first boot); the expressions are
# complements, so every backend case runs in exactly one chain (tests/vm/test_chains.py).
LVMCACHE_CHAIN = "lvmcache or flush_timeout"
BACKEND_CHAINS = {"backends": (f"not ({LVMCACHE_CHAIN})", "powercut.py"),
                  "lvmcache": (LVMCACHE_CHAIN, "")}
# The chains behind each session fixture, one worker thread each.
CHAINS = {"guest": {chain: functools.partial(backend_boots, cases=cases, then=then)
                    for chain, (cases, then) in BACKEND_CHAINS.items()},
          "safety_guest": {"safety": safety_boots, "faults": fault_boots}}
# Boot chains started when collection ends (tests/vm/conftest.py), so that the guests
# boot while the host tiers run: each is mostly one busy thread, and the session then
# waits for the slowest of them rather than for their sum.
EARLY: dict[str, Future] = {}


def start_early(names, tmp_path_factory) -> None:
    wanted = {chain: run for name in sorted(set(names) & set(CHAINS))
              for chain, run in CHAINS[name].items() if chain not in EARLY}
    if not wanted:
        return
    pool = ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="guest-boot")
    for chain, run in wanted.items():
        EARLY[chain] = pool.submit(run, tmp_path_factory.mktemp(chain))
    pool.shutdown(wait=False)


def chains(name: str, tmp_path_factory) -> dict:
    """The merged report of the boot chains behind session fixture `name`."""
    if not shutil.which("qemu-system-x86_64"):
        pytest.fail("qemu-system-x86_64 is missing: run .ci/install")
    if not (VENV / "bin" / "vng").exists():
        pytest.fail(f"{VENV}/bin/vng is missing: run .ci/install (virtme-ng is a dev extra)")
    reports = [EARLY[chain].result() if chain in EARLY else
               run(tmp_path_factory.mktemp(chain)) for chain, run in CHAINS[name].items()]
    for found in reports:
        sys.stderr.write(found["log_tail"])
    return merge(reports)


def merge(reports: list[dict]) -> dict:
    """One report from the chains' reports; `twice`: the cases more than one reported."""
    merged: dict = {"results": {}, "problems": [], "workdir": [], "log_tail": "",
                    "twice": []}
    for found in reports:
        merged["twice"] += sorted(set(merged["results"]) & set(found["results"]))
        merged["results"].update(found["results"])
        merged["problems"] += found["problems"]
        merged["workdir"].append(str(found["workdir"]))
        merged["log_tail"] += found["log_tail"]
    return merged


@pytest.fixture(scope="session")
def guest(tmp_path_factory):
    return chains("guest", tmp_path_factory)


@pytest.fixture(scope="session")
def safety_guest(tmp_path_factory):
    return chains("safety_guest", tmp_path_factory)


def run_boots(work: Path, boots) -> dict:
    """`boots`: (guest module, report, script after it, disks, -k expression) each, in
    order; a boot that produced no report ends the chain."""
    found: dict[str, str | None] = {}
    problems = []
    tail = ""
    for module, report, then, disks, cases in boots:
        rc, console = boot(work, module, report, then, disks, cases)
        xml = work / "out" / report
        if not xml.exists():
            log = work / "out" / (report + ".log")
            detail = log.read_text()[-4000:] if log.exists() else console[-4000:]
            problems.append(f"boot for {module} produced no report (vng exit {rc}):\n{detail}")
            break
        found.update(results(xml))
        tail += (work / "out" / (report + ".log")).read_text()[-3000:]
    return {"results": found, "problems": problems, "workdir": work, "log_tail": tail}


IDS = [f"guest_backends.py::{case}[{b}]" for b in BACKENDS for case in BOOT1] + \
      [f"guest_backends.py::{case}" for case in BOOT1_ONCE] + \
      [f"guest_reboot.py::{case}[{b}]" for b in BACKENDS for case in BOOT2] + \
      [f"guest_reboot.py::{case}" for case in BOOT2_ONCE]


SAFETY_IDS = [f"guest_safety.py::{case}" for case in SAFETY_BOOT1] + \
             [f"guest_safety_reboot.py::{case}" for case in SAFETY_BOOT2]


@pytest.mark.parametrize("boots, listed", [("guest", IDS), ("safety_guest", SAFETY_IDS)])
def test_guest_report_is_exactly_the_listed_cases(request, boots, listed):
    """The guest's reports and cases.py name the same cases: a guest test that is not
    listed (and so would fail unseen), a listed one that never reports, or one that two
    boot chains both ran, fails here. With HOTCACHE_VM_K (a development boot) the guest runs a subset of the list."""
    guest = request.getfixturevalue(boots)
    if guest["problems"]:
        pytest.fail("\n".join(guest["problems"]))
    assert not guest["twice"], f"guest cases run by two boot chains: {guest['twice']}"
    reported = set(guest["results"])
    unlisted = sorted(reported - set(listed))
    assert not unlisted, f"guest cases missing from tests/vm/cases.py: {unlisted}"
    if not os.environ.get("HOTCACHE_VM_K"):
        assert reported == set(listed), f"listed but not reported: {sorted(set(listed) - reported)}"


@pytest.mark.parametrize("case", IDS)
def test_in_guest_kernel(guest, case):
    expect(guest, case)


@pytest.mark.parametrize("case", SAFETY_IDS)
def test_storage_safety_in_guest_kernel(safety_guest, case):
    expect(safety_guest, case)


def expect(guest: dict, case: str) -> None:
    if case not in guest["results"]:
        why = "\n".join(guest["problems"]) or "it did not run (an earlier guest case stopped the run)"
        logs = ", ".join(guest["workdir"])
        pytest.fail(f"{case}: no result from the guest: {why}\n(logs in {logs})")
    failure = guest["results"][case]
    if failure is not None:
        pytest.fail(f"{case} failed in the guest kernel:\n{failure}")
