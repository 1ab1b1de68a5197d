"""system/beneath.py on real files, through openat2 and through its O_NOFOLLOW fallback:
no symlink followed anywhere, no way out of the root, odd names fine."""

from __future__ import annotations

import errno
import os

import pytest

from hotcache.provision.system import beneath


@pytest.fixture(params=["openat2", "fallback"])
def root(request, tmp_path, monkeypatch):
    monkeypatch.setattr(beneath, "USE_OPENAT2", request.param == "openat2")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    top = tmp_path / "root"
    (top / "dir").mkdir(parents=True)
    (top / "dir" / "file").write_bytes(b"data")
    (top / "link").symlink_to(outside / "secret")
    (top / "dirlink").symlink_to(outside)
    fd = beneath.open_root(top)
    yield fd, top, outside
    os.close(fd)


def test_opens_files_beneath_and_no_symlink_anywhere(root):
    fd, _top, _outside = root
    f = beneath.open_at(fd, "dir/file")
    assert os.read(f, 10) == b"data"
    os.close(f)
    for rel in ("link", "dirlink/secret"):
        with pytest.raises(OSError) as exc:
            beneath.open_at(fd, rel)
        assert exc.value.errno == errno.ELOOP
    for rel in ("../outside/secret", "dir/../../outside/secret", "/etc/passwd"):
        with pytest.raises(OSError) as exc:
            beneath.open_at(fd, rel)
        assert exc.value.errno == errno.EXDEV


def test_create_never_follows_a_planted_link(root):
    fd, _top, outside = root
    with pytest.raises(OSError):
        beneath.open_at(fd, "link", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with pytest.raises(OSError):
        beneath.makedirs(fd, "dirlink/new")
    beneath.write_file(fd, "link", b"replaced")     # replaces the link, never writes through
    assert (outside / "secret").read_bytes() == b"secret"
    assert beneath.read_file(fd, "link") == b"replaced"
    assert not list(outside.glob("new"))


def test_odd_names_and_inode_checks(root):
    fd, top, _outside = root
    name = os.fsdecode(b"caf\xe9\n-x")
    sub = beneath.makedirs(fd, "a/b")
    os.close(sub)
    beneath.write_file(fd, f"a/b/{name}".rpartition("/")[2], b"x")
    st = os.stat(os.path.join(os.fsencode(top), os.fsencode(name)))
    f = beneath.open_at(fd, name)
    assert beneath.expect(f, st, name).st_ino == st.st_ino
    other = os.stat(top / "dir" / "file")
    with pytest.raises(beneath.Swapped):
        beneath.expect(f, other, name)
    os.close(f)
    assert beneath.strip_privilege(0o106755) == 0o755
    dfd = beneath.open_at(fd, "dir", beneath.DIR)
    beneath.empty(dfd)
    os.close(dfd)
    assert os.listdir(top / "dir") == []


@pytest.mark.root
def test_open_root_follows_only_symlinks_root_made(tmp_path):
    """The administrator's own symlinks on the way resolve; a symlink another user owns
    anywhere on the way (a group member who swapped their folder `team` for a link
    after the checks) is refused, and the last component is never a link."""
    real = tmp_path / "mnt" / "hot"
    (real / "team" / "ds").mkdir(parents=True)
    (tmp_path / "etc-like" / "ds").mkdir(parents=True)
    (tmp_path / "data").symlink_to(real)                   # root's own link: followed
    fd = beneath.open_root(tmp_path / "data" / "team" / "ds")
    assert beneath.same(os.fstat(fd), os.stat(real / "team" / "ds"))
    os.close(fd)
    fd = beneath.open_root(tmp_path / "data" / "team" / ".." / "team")
    assert beneath.same(os.fstat(fd), os.stat(real / "team"))
    os.close(fd)

    (real / "team").rename(real / "team.old")               # the user swaps in a link
    (real / "team").symlink_to(tmp_path / "etc-like")
    os.lchown(real / "team", 4242, 4242)
    with pytest.raises(beneath.Untrusted) as exc:
        beneath.open_root(tmp_path / "data" / "team" / "ds")
    assert exc.value.errno == errno.ELOOP and "owned by uid 4242" in str(exc.value)
    with pytest.raises(beneath.Untrusted):
        beneath.open_root(real / "team" / "ds")
    os.lchown(real / "team", 0, 0)                          # the same link, root's: followed
    fd = beneath.open_root(real / "team" / "ds")
    assert beneath.same(os.fstat(fd), os.stat(tmp_path / "etc-like" / "ds"))
    os.close(fd)
    with pytest.raises(OSError) as exc:                     # ... but never as the last part
        beneath.open_root(tmp_path / "data")
    assert exc.value.errno == errno.ELOOP


def test_a_descriptor_held_part_of_the_time_reads_as_itself_or_an_error_naming_why():
    """What is open only part of the time (a staging folder, DEST) is read through
    `held`: descriptor 0 is a descriptor like any other, only None is not held."""
    st = os.stat("/")
    assert beneath.held(0, "not open") == 0
    assert beneath.held(st, "not open") is st
    with pytest.raises(RuntimeError, match="^/x: the staging folder is not open$"):
        beneath.held(None, "/x: the staging folder is not open")
