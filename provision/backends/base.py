"""What a backend provides to the engine.

A backend instance plans against one Host (`self.host`, block/host.py): every read of
the machine (sysfs, probe commands, device facts, the kernel's features) goes through it,
so unit tests plan each backend against a fake host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from hotcache.provision.errors import RefusedError

if TYPE_CHECKING:
    from hotcache.provision.block.host import Host
    from hotcache.provision.backends.parts.contract import CacheSpec, Device, Planner
    from hotcache.provision.backends.parts.stats import CacheStats
    from hotcache.provision.plan import Ref
    from hotcache.provision.records import CacheEntry

# The signature a built cache left on a device, as blkid shows it (Backend.signature).
Signature: TypeAlias = "tuple[str | None, ...]"
# A cache's devices by role as the engine found them now, by identity (None: not present
# or not provably the recorded one).
Nodes: TypeAlias = "Mapping[str, str | None]"


@dataclass(frozen=True)
class Failure:
    """The kernel's own verdict that a cache device failed."""
    said: str                   # what the kernel reports, in its words where it has them
    dirty_bytes: int | None     # written to the cache only, now at risk; None: unknown
    # The mode in the live kernel table (None: not read): with no dirty count from the
    # kernel, only a cache whose table says writethrough and that never ran in writeback
    # has nothing at risk (blocks made dirty before a switch drain in the background).
    live_mode: str | None = None


class Backend:
    # --- the registry entry (backends/__init__.BACKENDS): what spec validation, discover,
    # doctor, restore, warm and the engine know about a backend, declared once, here.
    name: ClassVar[str] = "?"
    modes: ClassVar[tuple[str, ...]] = ()       # cache modes; the first is the default
    tunables: ClassVar[dict[str, type]] = {}    # spec `tunables:` keys and their types
    programs: ClassVar[tuple[str, ...]] = ()    # must be installed
    kernel_feature: ClassVar[str | None] = None  # what the kernel must offer (Host.kernel_has)
    modules: ClassVar[tuple[str, ...]] = ()     # what restore modprobes at boot
    restores_at_boot: ClassVar[bool] = False    # the engine installs (teardown removes) a
    #                                             boot-time restore unit
    restore_why: ClassVar[str | None] = None    # what a boot loses without it (doctor says)
    boot_loses_tunables_only: ClassVar[bool] = False  # with no tunables set, nothing to restore
    block_cache: ClassVar[bool] = True          # a cache in front of the origin (not `none`)
    promotes_gradually: ClassVar[bool] = False  # smq: warm sweeps windows of reads first
    min_bytes: ClassVar[int] = 64 * 2**20       # the smallest device it accepts
    fails_over: ClassVar[bool] = False          # a failed SSD is switched to the origin in
    #                                             place (failover_device; the watcher unit)
    attaches_on_origin: ClassVar[bool] = False  # after that switch, `build` attaches a new
    #                                             SSD under the mounted filesystem

    @classmethod
    def default_mode(cls) -> str:
        return cls.modes[0]

    def __init__(self, host: "Host"):
        self.host = host

    def unavailable(self) -> str | None:
        """Why this host cannot use the backend (None: it can)."""
        if self.kernel_feature and not self.host.kernel_has(self.kernel_feature):
            return KERNEL_MISSING[self.kernel_feature]
        return None

    def owns(self, entry: "CacheEntry | None", dev: "Device") -> bool:
        """True when the signatures on `dev` are the ones this cache put there."""
        raise NotImplementedError

    def signature(self, entry: "CacheEntry", role: str) -> Signature | None:
        """The signature a built cache left on its `role` device, as blkid shows it:
        (TYPE, UUID or None[, "may be absent"]); () for a device left without one; None:
        nothing to check."""
        return None

    def build(self, p: "Planner", spec: "CacheSpec", entry: "CacheEntry | None",
              devs: Mapping[str, "Device"]) -> "str | Ref":
        """Queue the steps that make the cached block device; return its node."""
        raise NotImplementedError

    def adopted_fs_uuid(self, devs: Mapping[str, "Device"]) -> str | None:
        """The UUID of a filesystem already on the origin that this backend caches in
        place instead of formatting (lvmcache on an existing LV); None: format."""
        return None

    def keeps_filesystem(self, entry: "CacheEntry | None", devs: Mapping[str, "Device"]) -> bool:
        """True when the cached device, even if it does not exist yet (being brought
        back after a boot), will show the filesystem hotcache already made on it."""
        return False

    # `nodes`: the cache's devices by role as the engine found them now, by identity
    # (None: not present or not provably the recorded one).

    def live(self, entry: "CacheEntry", nodes: Nodes) -> str | None:
        """Why the cache is not live now (its tables not loaded, its device not
        registered), so that teardown cannot flush it; None: it is live."""
        return None

    def stats(self, entry: "CacheEntry", nodes: Nodes) -> "CacheStats":
        """The cache's statistics as the kernel reports them (backends/parts/stats.py). Only
        block caches (`block_cache`) have any; status and warm ask no other backend."""
        raise NotImplementedError

    def failure(self, entry: "CacheEntry", nodes: Nodes) -> Failure | None:
        """The kernel's verdict that the cache device failed (dm-cache's Fail or
        read-only metadata, bcache's detached cache set, LVM's missing or failed PV);
        None when it reports nothing wrong. Reads only what answers without I/O to the
        cache device, so a dead SSD cannot hang it."""
        return None

    def failover_device(self, entry: "CacheEntry") -> str | None:
        """The device-mapper name of the cache's top device, the one whose table a
        fail-over switches to a linear mapping of the origin (backends/parts/failover.py)
        while the filesystem stays mounted; None: this backend does not fail over so
        (bcache detaches a failed cache set by itself) or the device is not active."""
        return None

    def drop_failed_cache(self, p: "Planner", entry: "CacheEntry", nodes: Nodes) -> str:
        """Queue the steps that take apart a cache whose SSD failed, without flushing or
        reading it, once its filesystem is unmounted; return the device that then holds
        the filesystem."""
        raise RefusedError(f"taking apart a {self.name} cache whose SSD failed is not "
                           "something hotcache does yet; nothing was changed",
                           hint="`hotcache teardown NAME --forget` forgets the cache; "
                                "its devices are then yours to take apart")

    def surviving_state(self, entry: "CacheEntry") -> dict[str, Any]:
        """The backend_state facts that still hold once `drop_failed_cache` has run: what
        re-attaching a new SSD to the origin (an apply after the teardown) starts from.
        None by default: the new SSD gets a new cache, the origin keeps its filesystem."""
        return {}

    def dismantle(self, p: "Planner", entry: "CacheEntry", nodes: Nodes) -> None:
        """Queue the steps that take the cache apart once its filesystem is unmounted
        (the engine then removes the boot-time unit when `restores_at_boot`)."""

    def kept_on_wipe(self, entry: "CacheEntry", role: str, node: str) -> str | None:
        """Why `teardown --wipe` leaves the signatures on the `role` device (at `node`)
        alone, as a note for the plan: it holds data hotcache adopted rather than made.
        None: --wipe erases them."""
        return None

    @classmethod
    def device_names(cls, cache: str, entry: "CacheEntry | None") -> set[str]:
        """The device-mapper names a cache named `cache` uses (its recorded `entry`, or
        None: not built yet), which no other cache's may share."""
        return set()

    def wipe_header(self, entry: "CacheEntry", role: str) -> tuple[str, int] | None:
        """hotcache's own header (block/header.py) on the `role` device, which `teardown
        --wipe` erases besides the signatures wipefs knows: its UUID and how many bytes
        from the device's start to zero; None: none there."""
        return None

    def hidden_signatures(self, entry: "CacheEntry | None", dev: "Device",
                          at: str) -> list[dict[str, Any]]:
        """Signatures on `dev` (read at `at`: its node, or its image file) that a build
        would format over where blkid does not look at its start (a filesystem behind
        where hotcache's header goes), to be refused like the ones it finds there unless
        the spec says `wipe: true`."""
        return []

    @classmethod
    def forget_loses(cls, entry: "CacheEntry") -> list[str]:
        """What the entry's backend_state alone knows, which `teardown --forget` loses
        (said before it is done); each an object of "--forget loses ..."."""
        return []


def present_origin(nodes: Nodes, cache: str) -> str:
    """The origin's node, for a step that must name it (the device that keeps the
    filesystem once a failed cache is dropped); a refusal when it is not present or not
    provably the recorded one, rather than a plan naming no device."""
    node = nodes.get("origin")
    if node is None:
        raise RefusedError(f"{cache}: its origin device is not present, or nothing proves it "
                           "is the one recorded; nothing was changed",
                           hint=f"put the origin disk back (`hotcache status {cache}` names "
                                f"each device it finds); `hotcache teardown {cache} --forget` "
                                "forgets the cache without touching a device")
    return node


KERNEL_FIX = {
    "bcache": "modprobe bcache, and add `bcache` to /etc/modules-load.d/hotcache.conf so it "
              "loads at boot; the module ships with Debian's linux-image packages",
    "device-mapper": "modprobe dm-mod dm-cache dm-cache-smq, and add them to "
                     "/etc/modules-load.d/hotcache.conf so they load at boot",
}
KERNEL_MISSING = {
    "device-mapper": "the kernel has no device-mapper (`dmsetup version` cannot reach it)",
    "bcache": "the kernel has no bcache (no /sys/fs/bcache; `modprobe bcache` failed or "
              "was not run)",
}
