"""`status` finds problems with a code besides the message, and `doctor` picks its fix
from one table keyed by code: rewording a message never changes the advice."""

from __future__ import annotations

import dataclasses

from hotcache.provision.engine import status
from hotcache.provision.engine.status import Code as Drift
from hotcache.provision.observe import doctor
from hotcache.provision.records import CacheEntry
from hotcache.provision.system.runner import Runner
from tests.helpers import hotcache_json
from tests.unit.observe.test_metrics import write_state


def drifted_entry(tmp_path) -> dict:
    """A cache whose apply did not finish, whose loop image is detached and whose
    mountpoint is not mounted; its fstab has no entry for it."""
    (tmp_path / "mnt").mkdir()
    (tmp_path / "fstab").write_text("")
    return {"backend": "none", "state": "building", "mode": None,
            "devices": {"origin": {"loop_file": str(tmp_path / "gone.img"), "node": "/dev/loop99",
                                   "size": 2**30}},
            "filesystem": {"mountpoint": str(tmp_path / "mnt"), "uuid": "1234"},
            "persist": {"fstab": str(tmp_path / "fstab")}, "spec": {"name": "data"}}


def test_status_gives_each_problem_a_code(tmp_path):
    row = status.cache_status("data", CacheEntry.model_validate(drifted_entry(tmp_path)),
                              Runner(), None)
    codes = [f["code"] for f in row["findings"]]
    assert codes == [Drift.DEVICE_MISSING, Drift.APPLY_UNFINISHED, Drift.NOT_MOUNTED,
                     Drift.NOT_IN_FSTAB]
    assert [f["message"] for f in row["findings"]] == row["problems"]
    assert "state is 'building': an apply did not finish" in row["problems"][1]


def test_rewording_a_status_message_keeps_doctor_advice(tmp_path):
    row = status.cache_status("data", CacheEntry.model_validate(drifted_entry(tmp_path)),
                              Runner(), None)
    said = doctor.check_drift({"data": row})
    reworded = {**row, "findings": [{**f, "message": f"reworded {n}"}
                                    for n, f in enumerate(row["findings"])]}
    again = doctor.check_drift({"data": reworded})
    assert [f.fix for f in again] == [f.fix for f in said]
    assert [f.code for f in again] == [f["code"] for f in row["findings"]]
    assert "losetup" in said[0].fix and "hotcache teardown data" in said[0].fix
    assert all("hotcache apply SPEC" in f.fix for f in said[1:])


def test_every_code_has_advice_and_nothing_else_does():
    codes = {*Drift, *doctor.Code}
    assert set(doctor.ADVICE) == codes
    for code in codes:
        assert doctor.ADVICE[code].strip(), code


def test_every_drift_code_advice_needs_only_the_cache_name_and_mountpoint():
    for code in Drift:
        fix = doctor.advice(code, name="data", mountpoint="/mnt/data")
        assert "hotcache" in fix or "umount" in fix, (code, fix)


def test_problem_findings_carry_a_code():
    fields = [f.name for f in dataclasses.fields(doctor.Finding)]
    assert "code" in fields
    found = doctor.Finding.coded("hot-copy", doctor.PROBLEM, "/x", "gone",
                                 doctor.Code.HOT_COPY_MISSING, path="/x")
    assert found.code == "HOT_COPY_MISSING" and found.fix == "copy it again with `hotcache copy SRC /x`"


def test_json_output_carries_the_codes(tmp_path):
    state = write_state(tmp_path / "m.yaml", {"data": drifted_entry(tmp_path)})
    rc, doc = hotcache_json("status", "--state", str(state), "--fstab", str(tmp_path / "fstab"))
    assert rc != 0
    assert [f["code"] for f in doc["caches"][0]["findings"]] == [
        "DEVICE_MISSING", "APPLY_UNFINISHED", "NOT_MOUNTED", "NOT_IN_FSTAB"]
    (tmp_path / "units").mkdir()
    rc, doc = hotcache_json("doctor", "--state", str(state), "--fstab", str(tmp_path / "fstab"),
                            "--system-fstab", str(tmp_path / "fstab"),
                            "--unit-dir", str(tmp_path / "units"))
    assert rc == 9
    drift = [f for f in doc["findings"] if f["check"] == "drift"]
    assert [f["code"] for f in drift] == ["DEVICE_MISSING", "APPLY_UNFINISHED", "NOT_MOUNTED",
                                          "NOT_IN_FSTAB"]
    assert all(f["code"] for f in doc["findings"] if f["severity"] != doctor.OK)
