"""Fail-over of a dm-cache (raw or lvm2's) to its origin, under the mounted filesystem.

A cache whose SSD the kernel stopped using (`Fail`, read-only metadata, `needs_check`)
serves no read it has to the SSD. When every block is on the origin (the live table
runs writethrough or passthrough, or the kernel counts zero dirty blocks), the cache's
top device-mapper device is switched in place to a linear mapping of its origin:
`dmsetup suspend --noflush`, `load` the linear table, `resume`, which is how LVM itself
replaces a live table. The filesystem above stays mounted and every open file stays
valid; a read in flight during the switch may fail once (the loaders retry it).

`decide` is the verdict alone, on the lines `dmsetup table` and `dmsetup status` print
(both answer from the kernel's memory, never with I/O to the devices). `switch` carries
it out and checks the verdict again while the device is suspended (no write can dirty
a block then), so a writeback cache that dirtied a block between the two reads is never
switched.
"""

from __future__ import annotations

from dataclasses import dataclass

from hotcache.provision.backends.parts.dmtable import failed, parse_status, parse_table
from hotcache.provision.errors import HotcacheError
from hotcache.provision.system.runner import Result, Runner

# What the watcher does about one cache.
HEALTHY = "healthy"         # the kernel reports nothing wrong
SWITCH = "switch"           # failed, every block on the origin: switch to the origin
ALARM = "alarm"             # failed with dirty data at risk (or unknown): the admin decides
UNANSWERED = "unanswered"   # the status read did not answer in time: nothing is switched
ON_ORIGIN = "on_origin"     # already a linear mapping (switched before)
NOT_LOADED = "not_loaded"   # no table loaded (not restored yet, or taken down)

CLEAN_MODES = ("writethrough", "passthrough")


@dataclass(frozen=True)
class Decision:
    action: str                  # one of the constants above
    said: str                    # the kernel's verdict in words ("" when healthy)
    kernel: str = ""             # the status line as the kernel printed it (trimmed)
    mode: str | None = None      # the live table's mode
    dirty_bytes: int | None = None   # None: the kernel reports no count

    @property
    def alarm(self) -> bool:
        return self.action in (ALARM, UNANSWERED)


def target(line: str) -> str | None:
    """The target type of a one-segment table or status line (`cache`, `linear`)."""
    f = line.split()
    return f[2] if len(f) > 2 else None


def decide(table: str | None, status: str | None, *, why: str = "",
           writeback_ever: bool | None = None) -> Decision:
    """The verdict on one top device from its `dmsetup table` and `dmsetup status` lines.
    `table` None: no table is loaded; `status` None: it could not be read (`why`: it did
    not answer in time, a device stuck in the kernel): never a switch. `writeback_ever`:
    the mapping's record of whether the cache ever ran writeback (None: not known)."""
    if table is None:
        return Decision(NOT_LOADED, "")
    kind = target(table)
    if kind == "linear":
        return Decision(ON_ORIGIN, "")
    if kind != "cache":
        return Decision(NOT_LOADED, f"its table is a {kind} target, not a cache")
    mode = parse_table(table).mode
    if status is None:
        return Decision(UNANSWERED, why or "`dmsetup status` gave no answer", mode=mode)
    line = " ".join(status.split()[3:]) if target(status) == "cache" else status.strip()
    dirty: int | None = None        # `Fail` and `Error` report no counters
    if line.split()[:1] not in (["Fail"], ["Error"]):
        try:
            st = parse_status(status)
        except (IndexError, ValueError):
            # Never switched on a line hotcache cannot read: only the kernel's verdict counts.
            return Decision(UNANSWERED, f"dm-cache's status is not one hotcache can read: "
                            f"{line!r}", line, mode)
        dirty = st["dirty_blocks"] * st["block_sectors"] * 512
    said = failed(status)
    if said is None:
        return Decision(HEALTHY, "", line, mode, dirty)
    if dirty is None and mode in CLEAN_MODES and writeback_ever is False:
        # Fail and Error report no counts; in writethrough (or passthrough) every write
        # reached the origin before it completed, so nothing is on the SSD only - unless
        # the cache once ran writeback (`writeback_ever`, or not known): the blocks it
        # dirtied then drain in the background after the switch to writethrough.
        return Decision(SWITCH, said, line, mode, 0)
    if dirty == 0:
        return Decision(SWITCH, said, line, mode, 0)
    # Dirty blocks counted (a writeback cache, or one switched to writethrough that has
    # not written them back yet), or none counted in writeback: never switched.
    return Decision(ALARM, said, line, mode, dirty)


def linear_table(table: str) -> str:
    """The linear mapping of the origin a cache table sits on: same length, same
    origin device (as the kernel names it, major:minor)."""
    t = parse_table(table)
    return f"0 {t.length} linear {t.origin} 0"


@dataclass(frozen=True)
class Switched:
    done: bool                   # the device now maps the origin
    decision: Decision           # the verdict checked while suspended
    table: str | None = None     # the linear table loaded
    replaced: str | None = None  # the cache table it replaced
    error: str | None = None     # why it did not switch, when a command failed


TIMEOUT = 30.0      # seconds each dmsetup call may take
# The resume that swaps the tables returns only once the kernel has torn down the cache
# table it replaced, which on a failing SSD can take long; the switch is done by then.
RESUME_TIMEOUT = 120.0


def switch(runner: Runner, name: str, *, writeback_ever: bool | None = None) -> Switched:
    """Switch dm device `name` from its cache table to a linear mapping of the origin,
    if (checked again while it is suspended) every block is on the origin. The device
    is never left suspended: a failure after the suspend resumes what was loaded."""
    def dm(*args: str, check: bool = True) -> Result:
        return runner.run(["dmsetup", *args], check=check,
                          timeout=RESUME_TIMEOUT if args[0] == "resume" else TIMEOUT)

    table = dm("table", name).stdout.strip()
    before = decide(table, dm("status", name).stdout, writeback_ever=writeback_ever)
    if before.action != SWITCH:
        return Switched(before.action == ON_ORIGIN, before)
    linear = linear_table(table)
    dm("suspend", "--noflush", name)
    try:
        now = decide(dm("table", name).stdout.strip(), dm("status", name).stdout,
                     writeback_ever=writeback_ever)
        if now.action != SWITCH:
            dm("resume", name)
            return Switched(False, now)
        dm("load", name, "--table", linear)
        dm("resume", name)
    except HotcacheError as exc:
        # Whatever failed, the filesystem above must not wait on a suspended device:
        # drop a table loaded but not active, and resume.
        dm("clear", name, check=False)
        dm("resume", name, check=False)
        if dm("table", name, check=False).stdout.strip() == linear:
            # the kernel had swapped the tables (a resume that answered after its bound)
            return Switched(True, before, linear, table)
        return Switched(False, before, error=str(exc))
    return Switched(True, now, linear, table)
