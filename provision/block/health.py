"""Whether a device still answers: one bounded read of its first 4 KiB.

A cache device that died returns I/O errors, or (a suspended or hung path) never returns.
Status and doctor must tell either apart from "no signature" without hanging, so the read
runs in a daemon thread and a read that has not returned in time is itself the answer."""

from __future__ import annotations

import mmap
import os
import stat
import threading

from hotcache.provision.block.host import Host

PROBE_BYTES = 4096


def read_error(host: Host, node: str, timeout: float = 5.0) -> str | None:
    """Why `node` cannot be read now; None when its first 4 KiB read back."""
    path = host.path(node)
    answer: list[str | None] = []

    def probe() -> None:
        try:
            flags = os.O_RDONLY | os.O_CLOEXEC
            if stat.S_ISBLK(os.stat(path).st_mode):
                flags |= os.O_DIRECT        # from the device, not the page cache
            fd = os.open(path, flags)
            try:
                # O_DIRECT wants an aligned buffer: an anonymous mmap is page-aligned.
                with mmap.mmap(-1, PROBE_BYTES) as page:
                    os.preadv(fd, [page], 0)
            finally:
                os.close(fd)
            answer.append(None)
        except OSError as exc:
            answer.append(f"reading {node} fails: {exc.strerror or exc}")

    worker = threading.Thread(target=probe, name=f"probe {node}", daemon=True)
    worker.start()
    worker.join(timeout)
    if not answer:
        return f"a read of {node} did not return within {timeout:.0f} s"
    return answer[0]
