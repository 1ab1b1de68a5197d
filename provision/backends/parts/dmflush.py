"""Writing a dm-cache's dirty blocks back before it is taken apart: shared by dm-cache
and lvmcache (an lvmcache LV is a dm-cache table that lvm names), so neither backend
imports the other."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from hotcache.provision.backends.parts.dmtable import parse_status
from hotcache.provision.errors import CommandFailed, FlushIncomplete
from hotcache.provision.system.runner import Runner
from hotcache.provision.system.waits import flush_timeout, wait_drained

MIN_MIGRATION = 2048   # sectors a migration may move at once: the kernel's default


def cache_status(name: str, runner: Runner) -> dict[str, Any]:
    """The parsed `dmsetup status` of a live cache; the table going away mid-flush is an
    error that keeps everything (the dirty blocks are still on the SSD)."""
    try:
        return parse_status(runner.run(["dmsetup", "status", name]).stdout)
    except CommandFailed as exc:
        raise FlushIncomplete(
            f"dm-cache {name} stopped being live before its dirty blocks were written back "
            f"({exc.message}); the SSD, the mapping entry and the boot unit are kept",
            hint="`hotcache restore` loads it again; then run teardown again") from None


def ensure_writeback(name: str, runner: Runner, say: Callable[[str], object] | None = None,
                     need_cleaner: bool = True) -> None:
    """Before waiting on a flush: the loaded table must be able to write back. The cleaner
    policy must be active (`need_cleaner`) and migration_threshold large enough (0 holds
    every dirty block); a low threshold is raised in place and read back.

    lvmcache passes need_cleaner=False: measured in the guest kernel (lvm2 2.03.16), the
    table still named policy mq after `lvchange --cachepolicy cleaner` and `--refresh`,
    yet smq wrote the dirty blocks back and `lvconvert --uncache` flushes with lvm's own
    cleaner before it removes anything."""
    say = say or sys.stderr.write
    st = cache_status(name, runner)
    if need_cleaner and st["policy"] != "cleaner":
        raise FlushIncomplete(f"dm-cache {name} runs policy {st['policy']} after the cleaner "
                              "was loaded, so its dirty blocks would never be written back; "
                              "nothing was removed",
                              hint=f"check `dmsetup table {name}`, then run teardown again")
    threshold = int(st["core_args"].get("migration_threshold", MIN_MIGRATION))
    if threshold >= MIN_MIGRATION:
        return
    runner.run(["dmsetup", "message", name, "0", "migration_threshold", str(MIN_MIGRATION)])
    now = int(cache_status(name, runner)["core_args"].get("migration_threshold", 0))
    if now < MIN_MIGRATION:
        raise FlushIncomplete(f"dm-cache {name}: migration_threshold stays {now} sectors after "
                              f"setting it to {MIN_MIGRATION}; writeback cannot proceed")
    say(f"  dm-cache {name}: migration_threshold was {threshold} sectors, which holds "
        f"writeback back; set to {MIN_MIGRATION}\n")


def diagnose(name: str, runner: Runner) -> str:
    st = cache_status(name, runner)
    meta = st["metadata_mode"] + (", needs_check" if st["needs_check"] else "")
    return (f"{st['dirty_blocks']} dirty blocks are held (policy {st['policy']}, "
            f"migration_threshold {st['core_args'].get('migration_threshold', '?')}, metadata "
            f"{meta}). An origin that returns I/O errors holds them (see `dmesg`), or a "
            f"changed table (`dmsetup table {name}`). The cache and its dirty blocks are kept: "
            "fix the origin, then run teardown again")


def wait_clean(name: str, runner: Runner, **wait: Any) -> None:
    def remaining() -> tuple[int, str]:
        st = cache_status(name, runner)
        return st["dirty_blocks"], f"{st['dirty_blocks']} dirty blocks"
    wait_drained(f"dm-cache {name} to write its dirty blocks back", remaining,
                 timeout=flush_timeout(), diagnose=lambda: diagnose(name, runner),
                 hint="the cache still holds dirty blocks and was NOT removed; run teardown "
                      "again to keep flushing (HOTCACHE_FLUSH_TIMEOUT sets how long to wait)",
                 **wait)
