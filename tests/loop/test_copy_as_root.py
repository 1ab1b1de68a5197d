"""Hot copies as root on a real XFS that a training user can write to (the host spec's
`owner: train:train`, mode 2775, docs/running-as-root.md): real attacks by a real unprivileged user's files, each
checking that nothing outside DEST changed and no secret was copied. Races are made
deterministic by running the attacker's step from a wrapper around one of the copier's
own steps (the moment a real attacker would have to hit)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from hotcache.provision.errors import HotcacheError, RefusedError
from hotcache.provision.hotcopy import copier, filecopy
from tests.helpers import HOTCACHE, hotcache, hotcache_json, loop_spec
from tests.loop.test_copy_xfs import fill_until, small_xfs
from tests.unit.hotcopy.test_copy import make_dataset, sha256sum_check, tree

pytestmark = pytest.mark.root


@pytest.fixture
def shared(sandbox, user):
    """A loop-mounted XFS whose top folder the user owns, mode 2775 (as the README's
    example mount), a source dataset and a victim folder of root's outside it."""
    mnt = small_xfs(sandbox, "hot", 300)
    os.chown(mnt, user.pw_uid, user.pw_gid)
    os.chmod(mnt, 0o2775)
    src = make_dataset(sandbox / "src", n=4)
    victim = sandbox / "victim"
    victim.mkdir(mode=0o700)    # root-private, like /root: the same kind as a staging folder
    (victim / "keep.txt").write_bytes(b"root's own data\n")
    (victim / "secret").write_bytes(b"TOPSECRET\n")
    os.chmod(victim / "secret", 0o600)
    return mnt, src, victim


def xfs_at(image: Path, mp: Path, size_mib: int = 300) -> Path:
    """An XFS on a loop device mounted at `mp` (the sandbox fixture releases both)."""
    subprocess.run(["truncate", "-s", f"{size_mib}M", image], check=True)
    dev = subprocess.run(["losetup", "--find", "--show", image], check=True,
                         capture_output=True, text=True).stdout.strip()
    subprocess.run(["mkfs.xfs", "-q", dev], check=True)
    mp.mkdir()
    subprocess.run(["mount", "-o", "noatime", dev, mp], check=True)
    return mp


def as_user(user, path: Path) -> None:
    os.lchown(path, user.pw_uid, user.pw_gid)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root (and root): bytes, mode, owner: what must not change."""
    out = {}
    for p in [root, *sorted(root.rglob("*"))]:
        st = os.lstat(p)
        data = p.read_bytes() if stat.S_ISREG(st.st_mode) else None
        out[str(p)] = (data, st.st_mode, st.st_uid, st.st_gid)
    return out


def secret_anywhere(mnt: Path) -> list[str]:
    return [str(p) for p in mnt.rglob("*")
            if p.is_file() and not p.is_symlink() and b"TOPSECRET" in p.read_bytes()]


def test_planted_staging_link_is_refused_and_the_victim_is_untouched(shared, user):
    mnt, src, victim = shared
    before = snapshot(victim)
    link = mnt / ".copy.hotcache-staging"
    link.symlink_to(victim)
    as_user(user, link)
    proc = hotcache("copy", src, mnt / "copy", "--owner", f"{user.pw_name}")
    assert proc.returncode != 0, proc.stdout
    assert "not a staging folder hotcache made" in proc.stderr and user.pw_name in proc.stderr
    assert "Traceback" not in proc.stderr
    assert snapshot(victim) == before
    assert not os.path.lexists(mnt / "copy")
    assert link.is_symlink()     # refused, not deleted: the admin looks at it


def test_forged_staging_folder_is_refused(shared, user):
    """The user prepares a staging folder naming SRC, with a journal that vouches for a
    file of their choosing: it is never resumed nor published."""
    mnt, src, _victim = shared
    stage = mnt / ".copy.hotcache-staging"
    stage.mkdir()
    os.chmod(stage, 0o700)   # right kind, right mode: only its owner gives it away
    (stage / ".hotcache-staging.json").write_text(json.dumps({"source": str(src)}))
    (stage / "cat").mkdir()
    (stage / "cat" / "000.jpg").write_bytes(b"forged")
    st = os.stat(src / "cat" / "000.jpg")
    (stage / ".hotcache-journal").write_text(json.dumps(
        ["cat/000.jpg", st.st_size, st.st_mtime_ns, "0" * 64]) + "\n")
    for p in [stage, *stage.rglob("*")]:
        as_user(user, p)
    proc = hotcache("copy", src, mnt / "copy")
    assert proc.returncode == RefusedError.exit_code, (proc.returncode, proc.stderr)
    assert f"owner {user.pw_name}" in proc.stderr
    assert not (mnt / "copy").exists()
    assert (stage / "cat" / "000.jpg").read_bytes() == b"forged"   # left for the admin


def test_symlink_swapped_in_during_a_refresh_changes_no_outside_file(shared, user,
                                                                     monkeypatch):
    """A refresh takes unchanged files from the published copy (owned by the user with
    --owner). The user swaps one for a symlink to a root file just before it is taken:
    that file keeps its owner and mode, and the copy still holds the right bytes."""
    mnt, src, _victim = shared
    victim = mnt / "root-only"             # a root file on the same filesystem as DEST
    victim.mkdir(mode=0o700)
    (victim / "secret").write_bytes(b"TOPSECRET\n")
    os.chmod(victim / "secret", 0o600)
    dest = mnt / "copy"
    # The user controls SRC: the file to be swapped gets the root file's size and mtime,
    # so that only the way it is opened tells the two apart.
    secret = os.stat(victim / "secret")
    (src / "cat" / "001.jpg").write_bytes(b"x" * secret.st_size)
    os.utime(src / "cat" / "001.jpg", ns=(secret.st_atime_ns, secret.st_mtime_ns))
    copier.copy(src, dest, copier.CopyOptions(owner=user.pw_name))
    (src / "labels.csv").write_text("changed\n")       # so that the refresh publishes
    before = snapshot(victim)
    real = filecopy.FileCopier.link

    def attacker_first(self, e, digest):
        if e.rel == "cat/001.jpg":
            (dest / e.rel).unlink()
            (dest / e.rel).symlink_to(victim / "secret")
            as_user(user, dest / e.rel)
        return real(self, e, digest)

    monkeypatch.setattr(filecopy.FileCopier, "link", attacker_first)
    copier.copy(src, dest, copier.CopyOptions(owner=user.pw_name))
    assert snapshot(victim) == before
    assert tree(dest) == tree(src) and sha256sum_check(dest).returncode == 0
    assert not (dest / "cat" / "001.jpg").is_symlink()
    assert secret_anywhere(dest) == []


def test_folder_swapped_for_a_symlink_after_the_walk_copies_no_secret(shared, user,
                                                                      monkeypatch):
    """After SRC was listed, the user replaces SRC/dog by a symlink to a folder holding a
    secret under the same file names: nothing is read through it."""
    mnt, src, victim = shared
    os.chown(src, user.pw_uid, user.pw_gid)
    for i in range(4):
        (victim / f"{i:03}.jpg").write_bytes(b"TOPSECRET\n")
        os.chmod(victim / f"{i:03}.jpg", 0o600)
    before = snapshot(victim)
    real = filecopy.FileCopier.copy
    swapped = []

    def attacker_first(self, e):
        if not swapped:
            (src / "dog").rename(src / "dog.orig")
            (src / "dog").symlink_to(victim)
            as_user(user, src / "dog")
            swapped.append(e.rel)
        return real(self, e)

    monkeypatch.setattr(filecopy.FileCopier, "copy", attacker_first)
    with pytest.raises(HotcacheError, match="symlink"):
        copier.copy(src, mnt / "copy", copier.CopyOptions(owner=user.pw_name, jobs=1))
    assert swapped and not (mnt / "copy").exists()
    assert secret_anywhere(mnt) == []
    assert snapshot(victim) == before


def test_file_replaced_after_the_walk_is_not_copied(shared, monkeypatch):
    """Another file at the same name (a hard link to a secret the user can reach, here a
    plain replacement) is caught by its inode: the walk's file or nothing."""
    mnt, src, victim = shared
    real = filecopy.FileCopier.copy

    def attacker_first(self, e):
        if e.rel == "cat/002.jpg":   # renamed, not deleted: its inode number stays taken
            (src / e.rel).rename(src / "cat" / "002.orig")
            (src / e.rel).write_bytes(b"TOPSECRET\n")
        return real(self, e)

    monkeypatch.setattr(filecopy.FileCopier, "copy", attacker_first)
    with pytest.raises(HotcacheError, match="replaced by another file"):
        copier.copy(src, mnt / "copy", copier.CopyOptions(jobs=1))
    assert secret_anywhere(mnt) == []


def test_setuid_setgid_and_sticky_never_cross_a_copy(shared, user):
    mnt, src, _victim = shared
    tool = src / "tool"
    tool.write_bytes(b"#!/bin/sh\nid\n")
    os.chown(tool, user.pw_uid, user.pw_gid)
    os.chmod(tool, 0o6755)
    os.chmod(src / "cat", 0o3775)
    rc, out = hotcache_json("copy", src, mnt / "copy")
    assert rc == 0, out
    st = os.stat(mnt / "copy" / "tool")
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755
    assert stat.S_IMODE(os.stat(mnt / "copy" / "cat").st_mode) & 0o7000 == 0
    proc = hotcache("copy", src, mnt / "copy2", "--mode", "4755")
    assert proc.returncode == 2 and "setuid" in proc.stderr and "0755" in proc.stderr
    assert not (mnt / "copy2").exists()


ODD = [b"caf\xe9.jpg", b"new\nline.jpg", b"back\\slash.jpg", b"-n", b"--help", b"cr\rx",
       b" lead space", b"\xff\xfe/inner \xe9\n.bin"]


def run_json(*args) -> tuple[int, dict]:
    """The real CLI; its stderr may carry a name's raw bytes, as ls and sha256sum do."""
    proc = subprocess.run([*HOTCACHE, *map(str, args), "--json"], capture_output=True)
    return proc.returncode, json.loads(proc.stdout)


def test_any_file_name_linux_allows_is_copied_listed_and_verified(shared):
    mnt, src, _victim = shared
    for raw in ODD:
        path = os.path.join(os.fsencode(src), raw)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(raw * 3)
    dest = mnt / "copy"
    rc, out = run_json("copy", src, dest)
    assert rc == 0, out
    for raw in ODD:
        with open(os.path.join(os.fsencode(dest), raw), "rb") as f:
            assert f.read() == raw * 3
    check = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=dest,
                           capture_output=True)   # GNU coreutils' own reading of it
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(b": OK\n") == len(ODD) + 9
    manifest = (dest / "SHA256SUMS").read_bytes()
    assert b"  caf\xe9.jpg\n" in manifest                 # raw bytes, as sha256sum writes
    assert b"\n\\" in manifest and b"new\\nline.jpg" in manifest   # escaped, leading '\'
    rc, report = run_json("verify", dest, "--full")
    assert rc == 0 and report["ok"], report
    with open(os.path.join(os.fsencode(dest), b"caf\xe9.jpg"), "r+b") as f:
        f.write(b"X")
    rc, report = run_json("verify", dest, "--full")
    assert rc != 0 and [p["path"] for p in report["problems"]] == ["caf\udce9.jpg"]


def test_manifest_failure_keeps_the_journal(shared, monkeypatch):
    """A failure while the manifest is written leaves the journal: the next run resumes
    every file instead of starting over."""
    mnt, src, _victim = shared
    from hotcache.provision.hotcopy import manifest

    real = manifest.lines
    monkeypatch.setattr(manifest, "lines", lambda pairs: (_ for _ in ()).throw(
        OSError(5, "Input/output error")))
    with pytest.raises(HotcacheError):
        copier.copy(src, mnt / "copy", copier.CopyOptions())
    monkeypatch.setattr(manifest, "lines", real)
    out = copier.copy(src, mnt / "copy", copier.CopyOptions())
    assert out["resumed_files"] == out["files"] and out["copied_files"] == 0
    assert sha256sum_check(mnt / "copy").returncode == 0


def test_dest_on_its_own_mountpoint_stages_there_and_publishes(shared, sandbox):
    """DEST is an XFS of its own, mounted on a filesystem with almost no room: the copy
    is staged inside DEST (the space check and the publishing renames happen there),
    published in place, refreshed, and verified."""
    mnt, _src, _victim = shared
    src = make_dataset(sandbox / "big", n=4, size=1 << 20)       # 8 MiB
    dest = xfs_at(sandbox / "dest.img", mnt / "dest")
    fill_until(mnt, 1 << 20)
    rc, out = hotcache_json("copy", src, dest)
    assert rc == 0, out
    assert os.path.ismount(dest)
    assert tree(dest) == tree(src) and sha256sum_check(dest).returncode == 0
    assert not list(mnt.glob(".*hotcache-staging")) and not list(dest.glob(".*staging"))
    (src / "cat" / "000.jpg").write_bytes(b"new bytes")
    (src / "labels.csv").unlink()
    rc, out = hotcache_json("copy", src, dest)
    assert rc == 0 and out["version"] == "2", out
    assert tree(dest) == tree(src) and sha256sum_check(dest).returncode == 0
    rc, report = hotcache_json("verify", dest, "--full")
    assert rc == 0 and report["ok"], report


def test_verify_records_its_result_without_following_a_planted_link(shared, user,
                                                                   monkeypatch):
    """verify rewrites the copy's metadata in DEST, which the user owns. The moment the
    new file is in place, the user swaps it for a symlink to a root file: that file keeps
    its owner, mode and bytes (owner and mode were set on the open file, not by path)."""
    from hotcache.provision.hotcopy import verify
    from hotcache.provision.system import beneath

    mnt, src, victim = shared
    dest = mnt / "copy"
    copier.copy(src, dest, copier.CopyOptions(owner=user.pw_name))
    before = snapshot(victim)
    real = beneath.write_file

    def then_swap(dirfd, name, data, mode=0o644, owner=None):
        real(dirfd, name, data, mode, owner)
        os.rename(dest / name, dest / "was-meta")
        (dest / name).symlink_to(victim / "secret")

    monkeypatch.setattr(beneath, "write_file", then_swap)
    report = verify.verify(dest, "full")
    assert report["ok"] and report["recorded"]
    assert snapshot(victim) == before


def mount_options_of(mp: Path) -> set[str]:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(mp):
            return set(fields[5].split(","))
    raise AssertionError(f"{mp} is not mounted")


@pytest.mark.parametrize("allow", [False, True], ids=["default", "nosuid_nodev-false"])
def test_the_hot_tier_is_mounted_nosuid_nodev_unless_the_spec_says_otherwise(sandbox, allow):
    """A setuid program or device node that lands on the hot tier gives no privilege:
    apply mounts it nosuid,nodev (and writes that into fstab) unless the spec opts out."""
    spec = sandbox / "spec.yaml"
    extra = {"nosuid_nodev": "false"} if allow else {}
    spec.write_text(loop_spec(sandbox, owner="nobody:nogroup", mode="'2775'", **extra))
    rc, doc = hotcache_json("apply", spec, "--yes")
    assert rc == 0, doc
    opts = mount_options_of(sandbox / "mnt" / "hot")
    assert ({"nosuid", "nodev"} <= opts) is not allow
    fstab = (sandbox / "fstab").read_text()
    assert ("nosuid,nodev" in fstab) is not allow
    rc, status = hotcache_json("status")
    assert rc == 0, status


def test_warm_reads_nothing_through_a_folder_swapped_for_a_symlink(shared, user, monkeypatch):
    """After warm listed the files, the user swaps a folder for a symlink to a root folder
    holding a large file under the same name: warm reads none of it."""
    from hotcache.provision.tend import warm

    mnt, src, victim = shared
    dest = mnt / "copy"
    copier.copy(src, dest, copier.CopyOptions(owner=user.pw_name))
    (victim / "001.jpg").write_bytes(b"TOPSECRET" * 100_000)
    real = warm.files_under

    def listed_then_swapped(root_fd):
        files = real(root_fd)
        (dest / "dog").rename(dest / "dog.orig")
        (dest / "dog").symlink_to(victim)
        return files

    monkeypatch.setattr(warm, "files_under", listed_then_swapped)
    report = warm.warm(dest, backend="none", jobs=1)
    assert report["passes"][0]["bytes"] < 900_000      # the dataset is ~24 KB; the lure 900 KB


def test_staging_folder_swapped_right_after_mkdir_is_refused_not_adopted(shared, user,
                                                                         monkeypatch):
    """Between hotcache's mkdir of the staging folder and its open, a user of the shared
    parent renames the new folder away and puts their own in its place (mode 0777, with a
    subfolder they keep open): hotcache refuses, and never chowns, fills or publishes it."""
    from hotcache.provision.system import beneath

    mnt, src, _victim = shared
    stage = mnt / ".copy.hotcache-staging"
    real_open_at = beneath.open_at
    swapped = []

    def attacker_first(dirfd, rel, flags=os.O_RDONLY, mode=0o600):
        if rel == stage.name and not swapped:
            stage.rename(mnt / ".moved")
            stage.mkdir()
            os.chmod(stage, 0o777)
            (stage / "cat").mkdir(mode=0o777)
            for p in (stage, stage / "cat"):
                as_user(user, p)
            swapped.append(snapshot(stage))
        return real_open_at(dirfd, rel, flags, mode)

    monkeypatch.setattr(beneath, "open_at", attacker_first)
    with pytest.raises(RefusedError, match="replaced right after hotcache made it"):
        copier.copy(src, mnt / "copy", copier.CopyOptions(jobs=1))
    assert swapped and snapshot(stage) == swapped[0]    # still theirs, untouched
    assert not (mnt / "copy").exists()
