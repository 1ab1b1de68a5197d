"""The fail-over watcher: `hotcache failover --watch`, run by hotcache-failover.service.

Once a second (by default) it reads, for each dm-cache and lvmcache in the mapping, the
top device's `dmsetup table` and `dmsetup status` (the kernel answers both from memory,
without I/O to the SSD) and acts on the verdict of backends/parts/failover.decide:

- `switch`: the kernel stopped using the SSD and every block is on the origin: the
  device is switched in place to a linear mapping of the origin, the filesystem stays
  mounted, and the mapping records `on_origin` (status, doctor and the metrics say
  "running on the origin since ..."; a boot restores the filesystem on the bare origin);
- `alarm`: failed with dirty data at risk (writeback): nothing is switched, the journal
  says so once, and status, doctor, the metrics and the alert rule raise it; the choice
  stays with the administrator (`hotcache teardown NAME --cache-failed --accept-loss`);
- `unanswered`: a read did not answer within its bound: nothing is switched, and no
  second read of that device starts while the first is stuck.

Each read runs in a thread of its own and is waited for a bounded time, because a
process stuck in the kernel on a dead device is not ended by a timeout (subprocess waits
for it after killing it).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from hotcache.provision import mapping
from hotcache.provision.backends import get as get_backend
from hotcache.provision.backends.parts import failover
from hotcache.provision.backends.parts.failover import Decision, Switched
from hotcache.provision.block.host import Host
from hotcache.provision.errors import HotcacheError
from hotcache.provision.records import CacheEntry, EntryState, OnOrigin
from hotcache.provision.system.clock import now

READ_TIMEOUT = 5.0      # seconds a status read may take before the verdict is `unanswered`
INTERVAL = 1.0          # seconds between two passes


class OutcomeDoc(TypedDict):
    """One cache's row of `hotcache failover --json`."""
    name: str
    device: str | None
    action: str
    said: str | None
    kernel: str | None
    mode: str | None
    dirty_bytes: int | None
    switched: bool
    on_origin_since: str | None
    message: str


@dataclass(frozen=True)
class Outcome:
    """What one pass found and did about one cache."""
    name: str
    device: str | None
    decision: Decision
    switched: Switched | None = None
    since: str | None = None         # when it was switched (this pass or before)

    def message(self) -> str:
        d = self.decision
        if self.since is not None and (self.switched is None or self.switched.done):
            said = d.said or "its SSD failed"
            return f"{self.name}: running on the origin since {self.since}: cache failed ({said})"
        if self.switched is not None and self.switched.error:
            return (f"{self.name}: cache failed ({d.said}); the switch to the origin failed: "
                    f"{self.switched.error}; the cache table was resumed")
        if d.action == failover.ALARM:
            risk = "an unknown amount of" if d.dirty_bytes is None else \
                f"{d.dirty_bytes / 2**20:.1f} MiB of"
            return (f"{self.name}: cache failed ({d.said}) with {risk} dirty data on the SSD "
                    f"only ({d.mode}): not switched to the origin. `hotcache teardown "
                    f"{self.name} --cache-failed --accept-loss ...` takes the loss")
        if d.action == failover.UNANSWERED:
            return f"{self.name}: {d.said} on {self.device}: nothing switched"
        if d.action == failover.HEALTHY:
            return f"{self.name}: healthy"
        return f"{self.name}: {d.action}{': ' + d.said if d.said else ''}"

    def to_json(self) -> OutcomeDoc:
        d = self.decision
        return {"name": self.name, "device": self.device, "action": d.action,
                "said": d.said or None, "kernel": d.kernel or None, "mode": d.mode,
                "dirty_bytes": d.dirty_bytes,
                "switched": bool(self.switched and self.switched.done),
                "on_origin_since": self.since, "message": self.message()}


class BoundedReads:
    """`dmsetup table` and `status` of a device, each pass in a thread waited for at most
    `timeout` seconds; a device whose read is still stuck gets no second one."""

    def __init__(self, host: Host, timeout: float = READ_TIMEOUT):
        self.host, self.timeout = host, timeout
        self._stuck: dict[str, threading.Thread] = {}
        self._tables: dict[str, str | None] = {}

    def read(self, device: str) -> tuple[str | None, str | None, str]:
        """(table, status, why): table None when no such device is loaded; status None
        when it could not be read, `why` saying so."""
        late = f"`dmsetup status {device}` did not answer within {self.timeout:g} s"
        busy = self._stuck.get(device)
        if busy is not None:
            if busy.is_alive():
                return self._tables.get(device), None, late + " (still waiting)"
            del self._stuck[device]
        box: dict[str, str | None] = {}

        def work() -> None:
            try:
                for what in ("table", "status"):
                    res = self.host.runner.run(["dmsetup", what, device], check=False,
                                               timeout=self.timeout)
                    if res.returncode != 0:
                        box["why"] = f"`dmsetup {what} {device}` failed: " \
                                     f"{(res.stderr or res.stdout).strip()}"
                        return
                    box[what] = res.stdout.strip()
            except HotcacheError as exc:
                box["why"] = str(exc)
        t = threading.Thread(target=work, name=f"read {device}", daemon=True)
        t.start()
        t.join(self.timeout)
        if t.is_alive():
            self._stuck[device] = t
            self._tables[device] = box.get("table", self._tables.get(device))
            return self._tables[device], None, late
        table = box.get("table")
        self._tables[device] = table
        return table, box.get("status"), box.get("why") or ""


def watched(data: dict[str, Any], names: Iterable[str] | None = None) -> dict[str, CacheEntry]:
    """The caches a pass looks at: built ones (or those named)."""
    chosen = list(names) if names else list(data["caches"])
    return {n: data["caches"][n] for n in chosen
            if n in data["caches"] and data["caches"][n].state == EntryState.READY}


class Watcher:
    def __init__(self, state_path: Path, host: Host, *, read_timeout: float = READ_TIMEOUT,
                 say: Callable[[str], None] | None = None):
        self.state_path, self.host = state_path, host
        self.reads = BoundedReads(host, read_timeout)
        self.say = say or (lambda line: print(f"hotcache failover: {line}", file=sys.stderr,
                                              flush=True))
        self._said: dict[str, str] = {}
        self._cache_tables: dict[str, str] = {}     # device -> the last cache table seen

    def check(self, names: Iterable[str] | None = None, *, act: bool = True) -> list[Outcome]:
        """One pass over the caches; `act` False: say what would be done, switch nothing."""
        out = []
        for name, entry in watched(mapping.load(self.state_path), names).items():
            outcome = self._one(name, entry, act)
            if outcome is not None:
                out.append(outcome)
                self._journal(outcome)
        return out

    def _one(self, name: str, entry: CacheEntry, act: bool) -> Outcome | None:
        backend = get_backend(entry.backend, self.host)
        if not backend.block_cache:
            return None
        device = backend.failover_device(entry)
        since = entry.on_origin.since if entry.on_origin else None
        if device is None:
            if since is not None:
                return Outcome(name, None, Decision(failover.ON_ORIGIN, entry.on_origin.said
                                                    if entry.on_origin else ""), since=since)
            return None
        table, status, why = self.reads.read(device)
        decision = failover.decide(table, status, why=why, writeback_ever=entry.writeback_ever)
        if table is not None and failover.target(table) == "cache":
            self._cache_tables[device] = table
        if decision.action == failover.ON_ORIGIN:
            before = self._cache_tables.get(device)
            if entry.on_origin is None and act and table is not None and before is not None \
                    and failover.linear_table(before) == table.strip():
                # Linear, yet not recorded, and exactly the switch of the cache table this
                # watcher saw: a switch whose record was never written (a resume that
                # answered too late). Recorded now, so that a boot restores the filesystem
                # on the origin, never on the failed SSD. Any other linear table (a
                # teardown's `lvconvert --uncache`) is not a fail-over.
                since = now()
                record(self.state_path, name, OnOrigin(
                    since=since, said="found switched to its origin, the switch unrecorded",
                    device=device, table=table))
                return Outcome(name, device, Decision(failover.ON_ORIGIN, ""), since=since)
            said = entry.on_origin.said if entry.on_origin else ""
            return Outcome(name, device, Decision(failover.ON_ORIGIN, said), since=since)
        if decision.action != failover.SWITCH or not act:
            return Outcome(name, device, decision, since=since)
        try:
            done = failover.switch(self.host.runner, device,
                                   writeback_ever=entry.writeback_ever)
        except HotcacheError as exc:
            done = Switched(False, decision, error=str(exc))
        if not done.done:
            return Outcome(name, device, done.decision, done)
        when = now()
        record(self.state_path, name, OnOrigin(since=when, said=done.decision.said,
                                               device=device, table=done.table or "",
                                               replaced=done.replaced))
        return Outcome(name, device, done.decision, done, since=when)

    def _journal(self, outcome: Outcome) -> None:
        """One line per change of what is true about a cache (not one per pass)."""
        line = outcome.message()
        before = self._said.get(outcome.name)
        if before != line:
            self._said[outcome.name] = line
            if before is not None or outcome.decision.action != failover.HEALTHY:
                self.say(line)

    def watch(self, names: Iterable[str] | None = None, interval: float = INTERVAL,
              passes: int | None = None) -> None:
        """Pass after pass, `interval` seconds apart (forever, or `passes` times). A
        mapping that cannot be read is said once and read again on the next pass."""
        chosen = list(names or [])
        self.say(f"watching {', '.join(chosen) or 'every cache in ' + str(self.state_path)} "
                 f"every {interval:g} s")
        done = 0
        while passes is None or done < passes:
            try:
                self.check(names)
            except HotcacheError as exc:
                if self._said.get("") != str(exc):
                    self._said[""] = str(exc)
                    self.say(str(exc))
            done += 1
            if passes is None or done < passes:
                time.sleep(interval)


def record(state_path: Path, name: str, moved: OnOrigin) -> None:
    """Note in the mapping that `name` runs on its origin: only on the built entry the
    pass looked at. One that an apply rewrote since (a new SSD attached in place of the
    linear mapping, state `building`) is the apply's to record."""
    with mapping.editing(state_path) as data:
        entry = data["caches"].get(name)
        if entry is not None and entry.state == EntryState.READY:
            entry.on_origin = moved
