"""Probes fail closed: a blkid, wipefs, dmsetup or lvs/pvs that exits non-zero or prints
what hotcache cannot parse is an error (exit 4) naming the command and its stderr, never
"blank" or "absent". Each probe is answered by a scripted runner."""

from __future__ import annotations

import pytest

from hotcache.provision.backends import dmcache, lvmcache
from hotcache.provision.block import blockdev
from hotcache.provision.block.host import Host
from hotcache.provision.errors import ExitCode, ProbeFailed
from hotcache.provision.system.runner import Result, Runner


class Scripted(Runner):
    """Answers every query with one (returncode, stdout, stderr) and records the argv."""

    def __init__(self, rc: int, out: str = "", err: str = ""):
        super().__init__()
        self.answer = (rc, out, err)
        self.asked: list[list[str]] = []

    def query(self, argv, *, check=True):
        self.asked.append([str(a) for a in argv])
        return Result([str(a) for a in argv], *self.answer)

    run = query


def fails(call, runner, program, stderr_part):
    with pytest.raises(ProbeFailed) as info:
        call(runner)
    err = info.value
    assert err.exit_code == ExitCode.COMMAND_FAILED == 4
    assert program in str(err) and stderr_part in str(err)
    assert runner.asked and runner.asked[0][0] == program
    return err


WIPEFS = lambda r: blockdev.signatures(Host(r), "/dev/loop7")        # noqa: E731
BLKID = lambda r: blockdev.fs_identity(Host(r), "/dev/loop7")        # noqa: E731


def test_wipefs_non_zero_is_an_error_not_a_blank_disk():
    fails(WIPEFS, Scripted(1, "", "wipefs: error: /dev/loop7: probing initialization "
                                  "failed: Permission denied"), "wipefs", "Permission denied")


def test_wipefs_without_json_support_is_an_error():
    fails(WIPEFS, Scripted(1, "", "wipefs: unrecognized option '--json'"), "wipefs",
          "unrecognized option")


def test_wipefs_garbage_is_an_error():
    fails(WIPEFS, Scripted(0, "DEVICE OFFSET TYPE\nloop7 0x0 xfs\n"), "wipefs", "not the JSON")
    fails(WIPEFS, Scripted(0, '{"signatures": "xfs"}'), "wipefs", "signatures")


def test_wipefs_blank_answers_are_blank():
    assert blockdev.signatures(Host(Scripted(0, "")), "/dev/x") == []
    assert blockdev.signatures(Host(Scripted(0, '{"signatures": []}')), "/dev/x") == []
    sig = {"device": "x", "offset": "0x0", "type": "xfs"}
    assert blockdev.signatures(Host(Scripted(0, '{"signatures": [%s]}' % str(sig)
                                              .replace("'", '"'))), "/dev/x") == [sig]


def test_blkid_failure_is_an_error():
    fails(BLKID, Scripted(4, "", "blkid: error: /dev/loop7: Operation not permitted"),
          "blkid", "Operation not permitted")


def test_blkid_nothing_found_on_a_device_it_cannot_open_is_an_error(tmp_path):
    # blkid exits 2, silently, both for "no signature" and for a device it cannot open.
    runner = Scripted(2)
    with pytest.raises(ProbeFailed) as info:
        blockdev.fs_identity(Host(runner), str(tmp_path / "gone"))
    assert "cannot be opened" in str(info.value)
    blank = tmp_path / "blank.img"
    blank.write_bytes(b"\0" * 4096)
    assert blockdev.fs_identity(Host(runner), str(blank)) == {}


def test_blkid_garbage_is_an_error():
    fails(BLKID, Scripted(0, "this is not export format\n"), "blkid", "unexpected output")
    assert blockdev.fs_identity(Host(Scripted(0, "TYPE=xfs\nUUID=u\n\n")), "/dev/x") == \
        {"TYPE": "xfs", "UUID": "u"}


def test_dmsetup_failure_is_an_error_only_does_not_exist_is_absent():
    fails(lambda r: dmcache.live_table("hc-a", r),
          Scripted(1, "", "/dev/mapper/control: open failed: No such device\nCommand failed."),
          "dmsetup", "Command failed")
    assert dmcache.live_table("hc-a", Scripted(1, "", "Device does not exist.\n"
                                                      "Command failed.")) is None


@pytest.mark.parametrize("call", [
    lambda r: lvmcache.lv_info(Host(r), "vg", "lv"),
    lambda r: lvmcache.pv_vg(Host(r), "/dev/loop7"),
])
def test_lvs_and_pvs_failure_is_an_error_only_not_found_is_absent(call):
    runner = Scripted(5, "", "  Reading VG vg failed: locking failed: Permission denied")
    with pytest.raises(ProbeFailed) as info:
        call(runner)
    assert "locking failed" in str(info.value) and info.value.exit_code == 4
    assert runner.asked[0][0] in ("lvs", "pvs") and runner.asked[0][0] in str(info.value)
    assert call(Scripted(5, '{"report": [{"lv": [], "pv": []}]}',
                         '  Volume group "vg" not found')) is None
    assert call(Scripted(5, "", '  Failed to find physical volume "/dev/loop7".')) is None


def test_lvs_garbage_or_old_lvm_without_json_is_an_error():
    with pytest.raises(ProbeFailed) as info:
        lvmcache.lv_info(Host(Scripted(0, "  LV   VG   Attr\n  data vg -wi-a-----\n")), "vg", "lv")
    assert "lvs" in str(info.value) and "JSON" in str(info.value)
    with pytest.raises(ProbeFailed):
        lvmcache.pv_vg(Host(Scripted(3, "", "  Unrecognised option --reportformat")), "/dev/x")
    with pytest.raises(ProbeFailed):
        lvmcache.lv_info(Host(Scripted(0, '{"report": "x"}')), "vg", "lv")
