"""The host side and the guest side share tests/vm/cases.py as a top-level module
(`from cases import ...`); put its folder on the path, so that the host test also runs
on its own (`pytest tests/vm/test_guest_kernel.py`), not only when the guest folder's
conftest happens to be collected first."""

import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    """SIGTERM (`.ci/run` stopping the guest tier early) ends the session as Ctrl-C
    does, through pytest_sessionfinish, which powers off the guests: QEMU runs under
    `timeout` in a process group of its own, which the signal does not reach."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupted)


def pytest_collection_finish(session):
    """Boot the guests now, in the background, when the session will need them: they
    then run beside the host tiers (HOTCACHE_VM_EARLY=0 boots them when first needed)."""
    if os.environ.get("HOTCACHE_VM_EARLY", "1") == "0" or os.geteuid() != 0 \
            or session.config.option.collectonly:
        return
    wanted, module = set(), None
    for item in session.items:
        start = getattr(getattr(item, "module", None), "start_early", None)
        if start is not None:
            module = item.module
            wanted |= set(getattr(item, "fixturenames", ()))
    if module is not None:
        module.start_early(wanted, session.config._tmp_path_factory)


def pytest_sessionfinish(session):
    """A session that stops early (-x, Ctrl-C) powers off guests it no longer needs."""
    import vmboot
    vmboot.stop_all()
