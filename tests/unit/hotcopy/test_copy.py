"""`hotcache copy`, `verify` and `copies` on real files, through the real entry point,
checked with the real `sha256sum -c`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from hotcache.provision import mapping

from tests.helpers import hotcache, hotcache_json, recorded_entry

META = ".hotcache-copy.json"


def make_dataset(root: Path, classes=("cat", "dog"), n=12, size=3000) -> Path:
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (root / c / f"{i:03}.jpg").write_bytes(os.urandom(size + i))
    (root / "labels.csv").write_text("".join(f"{i},cat\n" for i in range(n)))
    return root


def tree(root: Path, skip=(META, "SHA256SUMS", ".hotcache-mtimes")) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in skip}


def sha256sum_check(dest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=dest,
                          capture_output=True, text=True)


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTCACHE_STATE", str(tmp_path / "state" / "mappings.yaml"))
    return tmp_path


def test_copy_is_byte_exact_and_sha256sum_checks_it(env):
    src = make_dataset(env / "src")
    (src / "odd name\\with backslash").write_bytes(b"a")
    (src / "new\nline").write_bytes(b"b")
    dest = env / "hot" / "ds"
    dest.parent.mkdir()
    rc, out = hotcache_json("copy", src, dest, "--name", "pets", "--version", "v7")
    assert rc == 0, out
    assert tree(dest) == tree(src)
    check = sha256sum_check(dest)
    assert check.returncode == 0, check.stdout + check.stderr
    meta = json.loads((dest / META).read_text())
    assert meta["complete"] and meta["format"] == 1 and meta["hash"] == "sha256"
    assert (meta["name"], meta["version"], meta["files"]) == ("pets", "v7", 27)
    assert meta["bytes"] == sum(len(b) for b in tree(src).values())
    assert meta["source"] == str(src.resolve())
    assert not (env / "hot" / ".ds.hotcache-staging").exists()
    # timestamps and permission bits come along (refresh relies on the mtime)
    a, b = (src / "cat" / "003.jpg").stat(), (dest / "cat" / "003.jpg").stat()
    assert (a.st_mtime_ns, a.st_mode) == (b.st_mtime_ns, b.st_mode)


def test_flipped_byte_is_found_by_verify_and_repaired_by_copy(env):
    src = make_dataset(env / "src")
    dest = env / "ds"
    hotcache("copy", src, dest, check=True)
    assert hotcache("verify", dest, "--full").returncode == 0
    victim = dest / "dog" / "007.jpg"
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[100] ^= 0x01
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # bit rot keeps the mtime

    assert hotcache("verify", dest, "--fast").returncode == 0  # sizes cannot see it
    proc = hotcache("verify", dest, "--full")
    assert proc.returncode == 5
    assert "dog/007.jpg" in proc.stdout and "1 problems" in proc.stderr
    meta = json.loads((dest / META).read_text())
    assert meta["verify_ok"] is False and meta["verified_at"]
    rc, report = hotcache_json("verify", dest, "--full")
    assert rc == 5 and [p["path"] for p in report["problems"]] == ["dog/007.jpg"]

    # the next copy replaces the damaged file even though size and mtime look right
    rc, out = hotcache_json("copy", src, dest)
    assert rc == 0 and out["copied_files"] == 1 and out["version"] == "2"
    assert hotcache("verify", dest, "--full").returncode == 0
    assert tree(dest) == tree(src)


def test_verify_fast_and_sample_see_missing_and_extra_files(env):
    src = make_dataset(env / "src")
    dest = env / "ds"
    hotcache("copy", src, dest, check=True)
    (dest / "cat" / "001.jpg").unlink()
    (dest / "stray.bin").write_bytes(b"x")
    rc, report = hotcache_json("verify", dest, "--sample", "3")
    assert rc == 5 and report["hashed_files"] == 3
    problems = {p["path"]: p["problem"] for p in report["problems"]}
    assert problems["cat/001.jpg"] == "missing"
    assert problems["stray.bin"] == "not in the manifest"


def test_refresh_copies_only_changes_and_publishes_a_new_version(env):
    src = make_dataset(env / "src")
    dest = env / "ds"
    hotcache("copy", src, dest, check=True)
    kept = (dest / "cat" / "000.jpg").stat().st_ino
    rc, out = hotcache_json("copy", src, dest)
    assert rc == 0 and out["changed"] is False and out["version"] == "1"

    (src / "cat" / "001.jpg").write_bytes(b"changed")
    (src / "cat" / "100.jpg").write_bytes(b"added")
    (src / "dog" / "002.jpg").unlink()
    rc, out = hotcache_json("copy", src, dest)
    assert rc == 0, out
    assert (out["copied_files"], out["reused_files"], out["version"]) == (2, 23, "2")
    assert tree(dest) == tree(src)
    assert sha256sum_check(dest).returncode == 0
    assert (dest / "cat" / "000.jpg").stat().st_ino == kept   # hard-linked, not copied
    assert not (dest / "dog" / "002.jpg").exists()
    assert json.loads((dest / META).read_text())["previous_version"] == "1"
    assert [p.name for p in env.iterdir() if "hotcache" in p.name] == []


def test_checksum_refresh_finds_a_change_that_kept_size_and_mtime(env):
    src = make_dataset(env / "src")
    dest = env / "ds"
    hotcache("copy", src, dest, check=True)
    f = src / "cat" / "004.jpg"
    st = f.stat()
    f.write_bytes(os.urandom(st.st_size))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    rc, out = hotcache_json("copy", src, dest)
    assert rc == 0 and out["changed"] is False     # size+mtime cannot tell
    rc, out = hotcache_json("copy", src, dest, "--checksum")
    assert rc == 0 and out["changed"] and out["copied_files"] == 1
    assert (dest / "cat" / "004.jpg").read_bytes() == f.read_bytes()
    rc, out = hotcache_json("copy", src, dest, "--checksum")
    assert rc == 0 and out["changed"] is False


def test_selection_options_and_mode(env):
    src = make_dataset(env / "src", classes=("a", "b", "c"), n=20)
    dest = env / "ds"
    rc, out = hotcache_json("copy", src, dest, "--fraction", "0.1", "--seed", "3",
                            "--exclude", "*.csv", "--mode", "0640")
    assert rc == 0, out
    files = sorted(tree(dest))
    assert len(files) == 6 and {f.split("/")[0] for f in files} == {"a", "b", "c"}
    assert (dest / files[0]).stat().st_mode & 0o7777 == 0o640
    assert (dest / "a").stat().st_mode & 0o7777 == 0o750
    again = env / "ds2"
    hotcache("copy", src, again, "--fraction", "0.1", "--seed", "3", "--exclude", "*.csv",
             check=True)
    assert sorted(tree(again)) == files


def test_every_folder_gets_its_mode_parents_without_files_too(env):
    """Folders are made with their final mode before the files; a folder that holds
    only folders gets it as well."""
    src = env / "src"
    (src / "top" / "mid" / "leaf").mkdir(parents=True)
    (src / "top" / "mid" / "leaf" / "x.bin").write_bytes(b"x")
    (src / "y.bin").write_bytes(b"y")
    for dest, extra, want in ((env / "plain", (), 0o755), (env / "mode", ("--mode", "0640"), 0o750)):
        rc, out = hotcache_json("copy", src, dest, *extra)
        assert rc == 0, out
        for folder in ("top", "top/mid", "top/mid/leaf"):
            assert (dest / folder).stat().st_mode & 0o7777 == want, (dest, folder)


def test_symlink_out_of_src_is_not_followed(env):
    src = make_dataset(env / "src", n=2)
    secret = env / "secret.key"
    secret.write_text("do not copy me")
    (src / "cat" / "key").symlink_to(secret)
    (src / "cat" / "again.jpg").symlink_to("000.jpg")
    os.mkfifo(src / "fifo")
    dest = env / "ds"
    proc = hotcache("copy", src, dest)
    assert proc.returncode == 0, proc.stderr
    assert "cat/key: symlink points out of the source" in proc.stderr
    assert "fifo: not a regular file" in proc.stderr
    assert not (dest / "cat" / "key").exists() and not (dest / "fifo").exists()
    assert (dest / "cat" / "again.jpg").read_bytes() == (src / "cat" / "000.jpg").read_bytes()
    # the secret's bytes are nowhere under DEST (nor in a staging folder left behind),
    # and neither the manifest nor the metadata names the link
    for p in env.rglob("*"):
        if p.is_file() and p != secret and "src" not in p.relative_to(env).parts:
            assert b"do not copy me" not in p.read_bytes(), p
    listed = [line.split("  ", 1)[1] for line in (dest / "SHA256SUMS").read_text().splitlines()]
    assert "cat/key" not in listed and "fifo" not in listed and "cat/again.jpg" in listed
    assert json.loads((dest / META).read_text())["files"] == len(listed)


def test_capacity_check_refuses_before_touching_anything(env):
    src = make_dataset(env / "src", n=4)
    dest = env / "ds"
    free = os.statvfs(env).f_bavail * os.statvfs(env).f_frsize
    # a margin so large that no disk can hold bytes * (1 + margin)
    proc = hotcache("copy", src, dest, "--margin", str(2 * free))
    assert proc.returncode == 3
    found = re.search(r"needs .*, (\d+) bytes\) but has .* free \((\d+) bytes\)", proc.stderr)
    assert found, proc.stderr
    assert int(found[1]) > int(found[2]) > 0
    assert sorted(p.name for p in env.iterdir()) == ["src"]


@pytest.mark.parametrize("args,code,words", [
    (["{env}/nope", "{env}/ds"], 2, "does not exist"),
    (["{env}/src", "{env}/src/inside"], 2, "inside the source"),
    (["{env}/src", "{env}/ds", "--fraction", "1.5"], 2, "--fraction 1.5"),
    (["{env}/src", "{env}/ds", "--fraction", "0"], 2, "--fraction 0"),
    (["{env}/src", "{env}/ds", "--list", "{env}/list.txt"], 2, "'../x'"),
    (["{env}/src", "{env}/ds", "--mode", "rw-r--r--"], 2, "--mode"),
    (["{env}/src", "{env}/ds", "--owner", "no-such-user-xyz:nogroup"], 2, "--owner"),
    (["{env}/src", "{env}/ds", "--include", "*.none"], 2, "no files"),
    (["{env}/src", "{env}/ds", "--bwlimit", "fast"], 2, "--bwlimit"),
    (["{env}/src", "{env}/taken"], 3, "not a hot copy"),
    (["{env}/src", "{env}/missing/ds"], 2, "does not exist"),
])
def test_bad_input_is_refused_and_changes_nothing(env, args, code, words):
    make_dataset(env / "src", n=2)
    (env / "list.txt").write_text("cat/000.jpg\n../x\n")
    (env / "taken").mkdir()
    (env / "taken" / "precious.txt").write_text("mine")
    before = sorted(p.relative_to(env).as_posix() for p in env.rglob("*"))
    proc = hotcache("copy", *[a.format(env=env) for a in args])
    assert proc.returncode == code, proc.stderr
    assert words in proc.stderr
    assert sorted(p.relative_to(env).as_posix() for p in env.rglob("*")) == before


def test_verify_refuses_a_folder_that_is_not_a_hot_copy(env):
    (env / "plain").mkdir()
    proc = hotcache("verify", env / "plain")
    assert proc.returncode == 2 and "not a complete hot copy" in proc.stderr


def test_copy_on_a_managed_mount_is_recorded_in_the_mapping(env):
    state = env / "state" / "mappings.yaml"
    state.parent.mkdir()
    mount = env / "mnt" / "hot"
    mount.mkdir(parents=True)
    mapping.save(state, {"caches": {"hot": recorded_entry(
        "hot", filesystem={"mountpoint": str(mount)}, hot_copies={})}})
    src = make_dataset(env / "src", n=3)
    dest = mount / "pets"
    hotcache("copy", src, dest, "--name", "pets", check=True)
    recorded = yaml.safe_load(state.read_text())["caches"]["hot"]["hot_copies"]
    assert recorded[str(dest)]["name"] == "pets" and recorded[str(dest)]["files"] == 7
    assert recorded[str(dest)]["verified_at"] is None
    hotcache("verify", dest, "--full", check=True)
    recorded = yaml.safe_load(state.read_text())["caches"]["hot"]["hot_copies"]
    assert recorded[str(dest)]["verify_ok"] is True

    other = env / "elsewhere"
    hotcache("copy", src, other, check=True)
    rc, listing = hotcache_json("copies", env)
    assert rc == 0
    rows = {r["path"]: r for r in listing["copies"]}
    assert rows[str(dest)]["cache"] == "hot" and rows[str(dest)]["state"] == "verified"
    assert rows[str(other)]["state"] == "not verified" and rows[str(other)]["cache"] is None
    assert rows[str(dest)]["bytes"] == sum(len(b) for b in tree(dest).values())
    text = hotcache("copies", env, check=True).stdout
    assert "pets" in text and "verified" in text


def test_manifest_matches_hashlib(env):
    src = make_dataset(env / "src", n=2)
    dest = env / "ds"
    hotcache("copy", src, dest, check=True)
    lines = (dest / "SHA256SUMS").read_text().splitlines()
    for line in lines:
        digest, rel = line.split("  ", 1)
        assert hashlib.sha256((src / rel).read_bytes()).hexdigest() == digest
    assert len(lines) == 5


def device_reads(run) -> int:
    """Bytes this process read from block devices while `run()` ran (the kernel's own
    count, getrusage's ru_inblock in 512-byte units, for every thread)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_inblock
    run()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_inblock - before) * 512


def test_copy_verify_reads_back_before_publishing(env):
    """--verify drops the written pages and reads every byte back from the device: the
    kernel counts those reads. Without it, a copy reads nothing from a device. The
    copies run in this process, counted from after a first one loaded every module they
    use, from a source on tmpfs, whose pages no device holds: another process dropping
    the page cache meanwhile (as the root tiers running beside this one do) cannot add
    to the count. Then the CLI's `--verify` records the copy as verified."""
    from hotcache.provision.hotcopy import copier

    shm = Path(tempfile.mkdtemp(prefix="hotcache-verify-", dir="/dev/shm"))
    try:
        src = make_dataset(shm / "src", n=16, size=1 << 20)
        size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        copier.copy(src, env / "first", copier.CopyOptions(verify=True))
        plain_read = device_reads(lambda: copier.copy(src, env / "plain", copier.CopyOptions()))
        verify_read = device_reads(
            lambda: copier.copy(src, env / "verified", copier.CopyOptions(verify=True)))
        assert plain_read < size // 100, (plain_read, size)
        assert verify_read >= size, (verify_read, size)
        rc, out = hotcache_json("copy", src, env / "ds", "--verify")
        assert rc == 0, out
    finally:
        shutil.rmtree(shm)
    dest = env / "ds"
    meta = json.loads((dest / META).read_text())
    assert meta["verify_ok"] is True and meta["verified_at"]
    rc, listing = hotcache_json("copies", env)
    assert {r["path"]: r["state"] for r in listing["copies"]}[str(dest)] == "verified"


def test_journal_and_publish_come_after_syncfs(env, monkeypatch):
    """Durability: the staging filesystem is synced before files enter the journal (a
    resumed copy trusts it) and after the manifest and metadata are written, before the
    rename publishes them. A power cut cannot be made here, and `kill -9` keeps the page
    cache, so the order of the calls is observed through the fsops seam."""
    from hotcache.provision.hotcopy import copier, staging
    from hotcache.provision.system import fsops

    events: list[tuple] = []
    real_syncfs, real_append, real_publish = fsops.syncfs, staging.Staging.append, copier._publish

    staged = env / ".ds.hotcache-staging"

    def syncfs(target):                   # a path or the staging folder's descriptor
        events.append(("syncfs", (staged / "SHA256SUMS").exists()))
        real_syncfs(target)

    def append(self, done):
        events.append(("journal", len(done)))
        real_append(self, done)

    def publish(*args, **kwargs):
        events.append(("publish", None))
        real_publish(*args, **kwargs)

    monkeypatch.setattr(fsops, "syncfs", syncfs)
    monkeypatch.setattr(staging.Staging, "append", append)
    monkeypatch.setattr(copier, "_publish", publish)
    monkeypatch.setattr(copier, "CHECKPOINT_BYTES", 1)       # a checkpoint per batch
    src = make_dataset(env / "src", n=30)
    copier.copy(src, env / "ds", copier.CopyOptions(jobs=2))
    kinds = [e[0] for e in events]
    assert "journal" in kinds and kinds[-1] == "publish", events
    for i, (kind, _) in enumerate(events):
        if kind == "journal":
            assert kinds[i - 1] == "syncfs", events
    assert events[-2] == ("syncfs", True), events    # synced with the manifest written
    assert sum(n for kind, n in events if kind == "journal") == 61


def test_copy_verify_publishes_nothing_when_a_file_reads_back_wrong(env, monkeypatch):
    """A device that returns other bytes than were written cannot be made here, so the
    read-back of one file is made to differ; everything else is real."""
    from hotcache.provision.hotcopy import copier
    from hotcache.provision.hotcopy import verify
    from hotcache.provision.errors import DriftError

    src = make_dataset(env / "src", n=4)
    dest = env / "ds"
    real = verify.sha256_file

    def flaky(root_fd, rel, meter, evict=False):
        digest = real(root_fd, rel, meter, evict)
        return "0" * 64 if rel == "dog/002.jpg" else digest

    monkeypatch.setattr(verify, "sha256_file", flaky)
    with pytest.raises(DriftError, match="dog/002.jpg"):
        copier.copy(src, dest, copier.CopyOptions(verify=True))
    assert not dest.exists()
    staging = env / ".ds.hotcache-staging"
    assert not (staging / "dog" / "002.jpg").exists()
    assert "dog/002.jpg" not in (staging / ".hotcache-journal").read_text()

    monkeypatch.setattr(verify, "sha256_file", real)
    out = copier.copy(src, dest, copier.CopyOptions(verify=True))
    assert (out["copied_files"], out["resumed_files"]) == (1, 8)
    assert tree(dest) == tree(src) and sha256sum_check(dest).returncode == 0
