"""A group member on the shared hot filesystem against root's routine commands: a real
XFS cache (apply), its top folder the member's with mode 2775 as the README's example
spec makes it, root's commands run in this process, and the member's moves made by the
member's own account (`runuser`) at the moment a real attacker would have to hit, from
a wrapper around one of hotcache's own steps. Each test checks the victim's bytes, owner
and mode, and that nothing root did not make is published as verified."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from hotcache.provision.errors import HotcacheError, RefusedError
from hotcache.provision.hotcopy import copier, prune
from hotcache.provision.hotcopy.copier import CopyOptions
from tests.accounts import run_as
from tests.helpers import hotcache
from tests.loop.test_copy_as_root import snapshot
from tests.loop.test_kube_loop import build
from tests.unit.hotcopy.test_copy import make_dataset

pytestmark = pytest.mark.root


@pytest.fixture
def shared(open_sandbox, account):
    """The cache `hot`, its top folder owned by the member (`account`), mode 2775."""
    mnt = build(open_sandbox)
    os.chown(mnt, account.pw_uid, account.pw_gid)
    os.chmod(mnt, 0o2775)
    src = make_dataset(open_sandbox / "src", n=4)
    os.chmod(src.parent, 0o755)
    return mnt, src


def as_member(account, *argv) -> None:
    proc = run_as(account, list(argv))
    assert proc.returncode == 0, proc.stderr


def features() -> str:
    proc = hotcache("slurm", "features")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def recorded(state: Path) -> dict:
    import yaml

    data = yaml.safe_load(state.read_text())
    return data["caches"]["hot"].get("hot_copies") or {}


def state_file() -> Path:
    return Path(os.environ["HOTCACHE_STATE"])


def victims_folder(mnt: Path, owner) -> Path:
    """Another user's private folder (mode 0700) in the shared folder."""
    victim = mnt / "private"
    victim.mkdir(mode=0o700)
    for i in range(3):
        (victim / f"thesis-{i}.txt").write_bytes(f"chapter {i}\n".encode() * 100)
    for p in [victim, *victim.iterdir()]:
        os.chown(p, owner.pw_uid, owner.pw_gid)
    return victim


@pytest.mark.parametrize("when", ["check_paths", "select"])
def test_a_folder_renamed_to_dest_is_never_emptied(shared, account, user, monkeypatch, when):
    """The member renames another user's private folder to DEST's name (a rename inside
    the 2775 folder needs no right on the folder itself) right after root checked DEST's
    path, or while root walks SRC."""
    mnt, src = shared
    victim = victims_folder(mnt, user)
    before = snapshot(victim)
    dest = mnt / "ds"
    real = getattr(copier, when)

    def then_swap(*args, **kwargs):
        found = real(*args, **kwargs)
        as_member(account, "mv", victim, dest)
        return found

    monkeypatch.setattr(copier, when, then_swap)
    with pytest.raises(RefusedError, match="not empty and is not a hot copy|replaced during"):
        copier.copy(src, dest, CopyOptions(name="ds", version="1", state=state_file()))
    assert list(snapshot(dest).values()) == list(before.values())
    assert features() == ""


def test_a_folder_swapped_in_after_publishing_is_not_recorded_or_published(shared, account,
                                                                           monkeypatch):
    """Right after root publishes (the member watching with inotify), she swaps her own
    self-consistent copy in at DEST: the record names root's folder, so hers is published
    nowhere."""
    mnt, src = shared
    dest = mnt / "ds"
    hotcache("copy", src, mnt / "staged-by-root", "--name", "other", check=True)
    forged = mnt / "hers"
    shutil.copytree(mnt / "staged-by-root", forged)
    meta = json.loads((forged / ".hotcache-copy.json").read_text())
    meta.update(name="ds", version="1", verify_ok=True, verified_at=meta["copied_at"])
    (forged / ".hotcache-copy.json").write_text(json.dumps(meta))
    subprocess.run(["chown", "-R", f"{account.pw_uid}:{account.pw_gid}", forged], check=True)
    real_record = copier._record

    def swap_then_record(*args, **kwargs):
        as_member(account, "mv", dest, mnt / "roots")
        as_member(account, "mv", forged, dest)
        return real_record(*args, **kwargs)

    monkeypatch.setattr(copier, "_record", swap_then_record)
    copier.copy(src, dest, CopyOptions(name="ds", version="1", state=state_file(), verify=True))
    rec = recorded(state_file())[str(dest)]
    assert (rec["dev"], rec["inode"]) == (os.lstat(mnt / "roots").st_dev,
                                          os.lstat(mnt / "roots").st_ino)
    assert features() == ""        # the folder at DEST now is the member's
    labels = hotcache("kube", "labels")
    assert "ds-ds" not in labels.stdout, labels.stdout


def test_verifying_a_planted_folder_never_makes_it_count(shared, account):
    """A self-consistent folder planted by the member, and root following doctor's advice
    to verify it: it stays unrecorded, unpublished, and doctor says it is not hotcache's."""
    mnt, src = shared
    hotcache("copy", src, mnt / "real", "--name", "real", "--version", "1", "--verify",
             check=True)
    planted = mnt / "planted"
    shutil.copytree(mnt / "real", planted)
    meta = json.loads((planted / ".hotcache-copy.json").read_text())
    meta.update(name="ds", version="7")
    (planted / ".hotcache-copy.json").write_text(json.dumps(meta))
    subprocess.run(["chown", "-R", f"{account.pw_uid}:{account.pw_gid}", planted], check=True)
    doctor = hotcache("doctor")
    assert f"{planted} holds hot-copy metadata, but hotcache did not record" in doctor.stdout
    assert hotcache("verify", planted, "--full").returncode == 0
    assert str(planted) not in recorded(state_file())
    assert features() == "hc_real_1\n"


def test_a_recorded_copy_is_published_under_the_name_root_recorded(shared, account):
    """The copy's owner may rewrite its metadata file; the cluster is told the name and
    version hotcache recorded, never the ones written there."""
    mnt, src = shared
    dest = mnt / "ds"
    hotcache("copy", src, dest, "--name", "ds", "--version", "1", "--verify",
             "--owner", account.pw_name, check=True)
    assert features() == "hc_ds_1\n"
    meta = json.loads((dest / ".hotcache-copy.json").read_text())
    meta.update(name="imagenet", version="9")
    path = dest / ".hotcache-copy.json"
    proc = subprocess.run(["runuser", "-u", account.pw_name, "--", "tee", str(path)],
                          input=json.dumps(meta), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert features() == "hc_ds_1\n"


def test_a_fifo_swapped_into_the_source_fails_the_copy_instead_of_hanging_it(shared, account,
                                                                            monkeypatch):
    """After root's walk, a member of the dataset's group swaps a file for a FIFO: the
    copy fails naming it, promptly, and the next run resumes (the staging lock is free)."""
    mnt, src = shared
    os.chown(src / "cat", account.pw_uid, account.pw_gid)
    victim = src / "cat" / "002.jpg"
    real_select = copier.select

    def walk_then_fifo(*args, **kwargs):
        found = real_select(*args, **kwargs)
        as_member(account, "rm", "-f", victim)
        as_member(account, "mkfifo", victim)
        return found

    monkeypatch.setattr(copier, "select", walk_then_fifo)
    outcome: dict = {}

    def run() -> None:
        try:
            copier.copy(src, mnt / "ds", CopyOptions(name="ds", state=state_file()))
        except HotcacheError as exc:
            outcome["error"] = str(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "the copy hangs on the FIFO"
    assert "cat/002.jpg" in outcome.get("error", ""), outcome
    victim.unlink()
    victim.write_bytes(b"back")
    monkeypatch.setattr(copier, "select", real_select)
    copier.copy(src, mnt / "ds", CopyOptions(name="ds", state=state_file()))


def test_prune_never_judges_roots_copy_by_a_folder_flipped_in_at_its_path(shared, account,
                                                                          monkeypatch):
    """Between prune's listing and its reading of the metadata, the member flips her
    folder (whose metadata names a source that is gone) in at the path of root's recorded
    copy, and back: root's copy is no candidate and `--yes` deletes nothing."""
    mnt, src = shared
    dest = mnt / "ds"
    hotcache("copy", src, dest, "--name", "ds", "--version", "1", check=True)
    before = snapshot(dest)
    decoy = mnt / "decoy"
    shutil.copytree(dest, decoy)
    meta = json.loads((decoy / ".hotcache-copy.json").read_text())
    meta["source"] = str(src.parent / "gone-dataset")   # its folder there, the dataset not
    (decoy / ".hotcache-copy.json").write_text(json.dumps(meta))
    subprocess.run(["chown", "-R", f"{account.pw_uid}:{account.pw_gid}", decoy], check=True)
    real_open = prune._open_dir_nofollow

    def flipped(path: Path) -> int:
        if path == dest:
            as_member(account, "mv", dest, mnt / "roots")
            as_member(account, "mv", decoy, dest)
            try:
                return real_open(path)
            finally:
                as_member(account, "mv", dest, decoy)
                as_member(account, "mv", mnt / "roots", dest)
        return real_open(path)

    monkeypatch.setattr(prune, "_open_dir_nofollow", flipped)
    found = prune.find([mnt], keep=2, staging_hours=24, tf_caches=[], keep_keys=None,
                       older_than_days=None, recorded=prune.recorded_copies(state_file()))
    assert [c.path for c in found if not c.kept] == [], found
    assert snapshot(dest) == before
