"""One cache's row of `hotcache status` (`status.cache_status`), as one typed shape.

The row crosses subsystems: the CLI prints it (`status`, `status --json`), doctor judges
it, metrics, node labels, Slurm features and the Kubernetes manifests are made from it.
TypedDicts rather than classes, so that at run time a row stays the plain dict the JSON
document is made of, while mypy checks every key a reader names; the order of the keys
in `status --json` is the order `cache_status` builds them in. Its own module, importing
nothing of status', so that the observers can name it without a cycle (status asks
engine/workingset for the working set).
"""

from __future__ import annotations

from typing import Literal, TypedDict

from hotcache.provision.backends.parts.stats import CacheStats
from hotcache.provision.hotcopy.sizing import AdviceDoc
from hotcache.provision.records import EntryState


class DeviceSeen(TypedDict):
    """A recorded device, found by its identity (kernel names move)."""
    node: str | None                # its node now; None: not found
    present: bool


class CacheFailure(TypedDict):
    """The cache device's failure, as the kernel reports it and a bounded read finds it."""
    device: str | None              # the SSD, by the most stable name recorded
    kernel: str                     # what was found, joined with "; "
    dirty_bytes: int | None         # written to the failed cache only; None: unknown
    message: str
    on_origin_since: str | None     # switched to its origin then (the fail-over watcher)


class FindingDoc(TypedDict):
    """One thing status found wrong: its code (status.Code, for doctor and scripts) and
    the message `problems` also carries."""
    code: str
    message: str


Verdict = Literal["settled", "filling", "full", "thrashing"]


class BucketActivity(TypedDict):
    """bcache's churn: its buckets (no eviction counter) and whether it keeps missing."""
    buckets: dict[str, int]         # priority_stats' shares, in percent
    hit_ratio: float | None
    verdict: Verdict                # filling, full or thrashing
    message: str


class PromotionActivity(TypedDict):
    """dm-cache's and lvmcache's churn: promotions against demotions."""
    promotions: int
    demotions: int
    interval_s: float | None        # None: since the cache started
    demotions_per_promotion: float | None
    verdict: Verdict                # settled, filling or thrashing
    message: str


class WorkingSet(TypedDict):
    """The cache against what it is to hold (engine/workingset)."""
    sizing: AdviceDoc | None        # None: the sizes cannot be read
    activity: BucketActivity | PromotionActivity | None   # None: none to judge


class MountFacts(TypedDict):
    """The mount at the recorded mountpoint (sizes None when it is not mounted)."""
    mounted: bool
    noatime: bool
    fs_uuid_matches: bool
    options: list[str]
    size_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None


class _Seen(MountFacts):
    name: str
    backend: str
    mode: str | None
    state: EntryState               # as the mapping records it
    devices: dict[str, DeviceSeen]  # by role: origin, cache
    cached_device: str | None       # the node the filesystem is on
    mountpoint: str
    persistent: bool | None         # in the fstab it was recorded in; None: not persisted
    cache_failed: CacheFailure | None


class RowFacts(_Seen, total=False):
    """What status saw, before it is judged: a row without its verdict."""
    cache: CacheStats               # a block cache's statistics, when they could be read


class StatusRow(RowFacts):
    """One cache's row of `hotcache status`."""
    working_set: WorkingSet
    problems: list[str]             # the messages, as status has always printed them
    findings: list[FindingDoc]      # the same, each with its code
    ok: bool                        # no problem found
