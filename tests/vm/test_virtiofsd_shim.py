"""tests/vm/bin/virtiofsd, on the host: it takes the options virtme-ng gives the Rust
virtiofsd, starts QEMU's C daemon, and writes the pid file only once the socket listens,
so that the guests share the host's root through virtiofs rather than 9p."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import vmboot

pytestmark = pytest.mark.root
SHIM = vmboot.HERE / "bin" / "virtiofsd"


def test_the_guests_boot_with_the_shim_on_this_host():
    """Debian 12: QEMU's C daemon, no Rust one; the boots put the shim first on PATH."""
    assert vmboot.QEMU_VIRTIOFSD.exists(), "qemu-system-common is missing: run .ci/install"
    assert vmboot.virtiofsd_shim() == [str(SHIM.parent)]


def test_the_pid_file_names_the_daemon_once_its_socket_listens(tmp_path):
    sock = tmp_path / "vfs.sock"
    shim = subprocess.Popen([SHIM, "--syslog", "--no-announce-submounts", "--socket-path",
                             sock, "--shared-dir", tmp_path, "--sandbox", "none",
                             "--cache", "always"], stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + 30
        while not (tmp_path / "vfs.sock.pid").exists():
            assert shim.poll() is None, shim.stderr.read()
            assert time.monotonic() < end, "no pid file after 30 s"
            time.sleep(0.05)
        assert sock.is_socket()
        pid = int((tmp_path / "vfs.sock.pid").read_text())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        assert argv[0] == str(vmboot.QEMU_VIRTIOFSD).encode()
        assert argv[2:4] == [b"-o", f"source={tmp_path},cache=always,sandbox=chroot,log_level=err".encode()]
        os.kill(pid, signal.SIGTERM)        # what virtme-ng does when the guest is done
        shim.wait(timeout=30)               # the shim ends with its daemon
    finally:                                # never leave a daemon behind
        pidfile = tmp_path / "vfs.sock.pid"
        if pidfile.exists() and shim.poll() is None:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        if shim.poll() is None:
            shim.kill()
        shim.wait()


def test_a_daemon_that_never_listens_leaves_no_pid_file(tmp_path):
    """virtme-ng then falls back to 9p instead of QEMU failing to connect."""
    sock = tmp_path / "vfs.sock"
    res = subprocess.run([SHIM, "--socket-path", sock, "--shared-dir", tmp_path / "missing",
                          "--cache", "auto"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "did not listen" in res.stderr
    assert not (tmp_path / "vfs.sock.pid").exists()


def test_an_option_it_cannot_translate_is_refused(tmp_path):
    res = subprocess.run([SHIM, "--socket-path", tmp_path / "s", "--shared-dir", tmp_path,
                          "--thread-pool-size", "4"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "unknown option --thread-pool-size" in res.stderr
    assert not (tmp_path / "s.pid").exists()
