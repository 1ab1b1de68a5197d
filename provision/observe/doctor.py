"""`hotcache doctor`: look the host over and say how to fix each thing found.

Each check reads (never changes) the host and returns findings. A finding is a
`problem` (the exit status turns non-zero), a `warning` (worth knowing, nothing is
broken yet) or `ok`; problems and warnings always carry a code and the fix, as a command
where there is one. The fix comes from one table keyed by code (ADVICE), never from the
wording of a message: `status` can reword what it says without changing doctor's advice.
"""

from __future__ import annotations

import glob
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict

from hotcache.provision.system.strenum import StrEnum
from hotcache.provision import mapping
from hotcache.provision.backends import BACKENDS, PLAIN, block_cache
from hotcache.provision.backends.base import KERNEL_FIX
from hotcache.provision.block.host import Host
from hotcache.provision.system import fstab
from hotcache.provision.engine import restorelog
from hotcache.provision.engine.bootunit import unit_name
from hotcache.provision.engine.reattach import waiting
from hotcache.provision.engine.status import Code as Drift, cache_status
from hotcache.provision.engine.statusrow import StatusRow
from hotcache.provision.errors import HotcacheError
from hotcache.provision.hotcopy.format import CopyState
from hotcache.provision.hotcopy.sizing import FITS
from hotcache.provision.observe.metrics import hot_copies
from hotcache.provision.records import CacheEntry
from hotcache.provision.system.runner import PACKAGES, Runner, which

PROBLEM, WARNING, OK = "problem", "warning", "ok"
# Programs every backend needs (mounting, loop images, identifying filesystems).
BASE_PROGRAMS = ("mount", "umount", "losetup", "blkid", "wipefs", "mkfs.xfs", "findmnt")
KERNEL_FEATURE = {n: b.kernel_feature for n, b in BACKENDS.items() if b.kernel_feature}
# Backends whose settings the kernel forgets at reboot unless something restores them
# (bcache keeps only cache_mode in its superblock, raw dm-cache tables vanish entirely).
RESTORE_NEEDED = {n: b.restore_why for n, b in BACKENDS.items() if b.restore_why}
# ".../venv/bin/hotcache restore [NAME] [--options]"
RESTORE_COMMAND = re.compile(r"hotcache\S*\s+restore\b(?:\s+(?P<cache>[^-\s]\S*))?")
UDEV_RULE_DIRS = ("/etc/udev/rules.d", "/lib/udev/rules.d", "/usr/lib/udev/rules.d")


class Code(StrEnum):
    """What doctor's own checks find (drift is `status`'s codes, engine/status.Code)."""
    MAPPING_UNREADABLE = "MAPPING_UNREADABLE"
    NOT_ROOT = "NOT_ROOT"
    KERNEL_FEATURE_MISSING = "KERNEL_FEATURE_MISSING"    # a cache uses it
    KERNEL_FEATURE_UNUSED = "KERNEL_FEATURE_UNUSED"      # absent, and no cache needs it (ok)
    PROGRAMS_MISSING = "PROGRAMS_MISSING"                # a backend in use lacks programs
    PROGRAMS_UNUSED = "PROGRAMS_UNUSED"                  # absent, for a backend not in use (ok)
    NO_NOFAIL = "NO_NOFAIL"
    RESTORE_NOT_ENABLED = "RESTORE_NOT_ENABLED"
    RESTORE_MISSING = "RESTORE_MISSING"
    RESTORE_FAILED = "RESTORE_FAILED"                    # this boot's restore failed
    LOW_FREE_SPACE = "LOW_FREE_SPACE"
    HOT_COPY_MISSING = "HOT_COPY_MISSING"
    HOT_COPY_FAILED_VERIFICATION = "HOT_COPY_FAILED_VERIFICATION"
    HOT_COPY_VERIFY_OLD = "HOT_COPY_VERIFY_OLD"
    HOT_COPY_UNRECORDED = "HOT_COPY_UNRECORDED"
    CACHE_TOO_SMALL = "CACHE_TOO_SMALL"                  # block cache smaller than its data
    NO_ROOM_TO_REFRESH = "NO_ROOM_TO_REFRESH"            # plain SSD: copies cannot be refreshed
    THRASHING = "THRASHING"
    WAITING_FOR_SSD = "WAITING_FOR_SSD"                  # a failed SSD was taken off


# The fix for each code: a template filled with the facts of the finding.
APPLY_AGAIN = "`hotcache apply SPEC` (the same spec) puts it back as specified"
ADVICE: dict[str, str] = {
    Drift.DEVICE_MISSING: "reconnect the device (for a loop image: `losetup --find --show "
                          "IMAGE`), then `hotcache apply SPEC`; if it is gone for good, "
                          "`hotcache teardown {name}`",
    Drift.DEVICE_UNPROVEN: "put the recorded disk back (or let udev settle); `hotcache status "
                           "{name}` names each device it finds; hotcache touches none it "
                           "cannot prove",
    Drift.DEVICE_UNREADABLE: "`hotcache status {name}` shows the details; run doctor as root "
                             "so every device can be probed",
    Drift.DEVICE_RENAMED: "`hotcache status {name}` shows the details; `hotcache apply SPEC` "
                          "records the device under its new name",
    Drift.APPLY_UNFINISHED: APPLY_AGAIN,
    Drift.NOT_MOUNTED: APPLY_AGAIN,
    Drift.NO_NOATIME: APPLY_AGAIN,
    Drift.MOUNT_OPTIONS_MISSING: APPLY_AGAIN,
    Drift.NOT_IN_FSTAB: APPLY_AGAIN,
    Drift.WRONG_FILESYSTEM: "another filesystem is mounted there: unmount it (`umount "
                            "MOUNTPOINT`), then `hotcache apply SPEC`",
    Drift.ORIGIN_WITHOUT_CACHE: "unmount the bare origin from {name}'s mountpoint, then "
                                "`hotcache restore {name}` loads the cache and mounts it "
                                "(hotcache's fstab line waits for the restore; `mount -a` "
                                "and rescue systems do not)",
    Drift.FILESYSTEM_SHUT_DOWN: "stop what reads or writes under {name}'s mountpoint, then "
                                "`umount {mountpoint} && mount {mountpoint}` mounts it again "
                                "(XFS replays its journal); where the cache failed, its own "
                                "fix comes first",
    Drift.CACHE_FAILED: "the SSD under {name} failed; what is not dirty is on the origin. "
                        "`hotcache teardown {name} --cache-failed` takes the cache apart "
                        "without its SSD and leaves the origin with its filesystem (with "
                        "dirty data lost it asks for --accept-loss); then name a new SSD "
                        "in its spec and `hotcache apply SPEC` attaches a new cache to that "
                        "filesystem",
    Drift.STATS_UNREADABLE: "`hotcache status {name}` shows the details; `hotcache apply "
                            "SPEC` repairs drift",
    Code.MAPPING_UNREADABLE: "{hint}",
    Code.NOT_ROOT: "sudo hotcache doctor",
    Code.KERNEL_FEATURE_MISSING: "{kernel_fix}",
    Code.KERNEL_FEATURE_UNUSED: "{kernel_fix}",
    Code.PROGRAMS_MISSING: "apt-get install {packages}",
    Code.PROGRAMS_UNUSED: "apt-get install {packages}",
    Code.NO_NOFAIL: "add nofail,x-systemd.device-timeout=30s to the options on line {line} of "
                    "{path}{own}",
    Code.RESTORE_NOT_ENABLED: "systemctl enable {unit}, or `hotcache apply SPEC` again",
    Code.RESTORE_MISSING: "run `hotcache apply SPEC` again: it installs and enables {unit}, "
                          "which runs `hotcache restore` before the mount",
    Code.RESTORE_FAILED: "`journalctl -b -u {unit}` and `hotcache status {name}` say what is "
                         "missing; the mount waits for the restore, so nothing reads the "
                         "bare origin. Put it right, then `hotcache restore {name}`",
    Code.LOW_FREE_SPACE: "remove hot copies no longer used (`hotcache copies` lists them; "
                         "delete the folder), or move the cache to a bigger SSD",
    Code.HOT_COPY_MISSING: "copy it again with `hotcache copy SRC {path}`",
    Code.HOT_COPY_FAILED_VERIFICATION: "`hotcache verify {path} --full` names the files; "
                                       "re-run `hotcache copy` to repair it",
    Code.HOT_COPY_VERIFY_OLD: "`hotcache verify {path}`",
    Code.HOT_COPY_UNRECORDED: "not hotcache's: verifying it does not make it one. To serve "
                              "that data, `hotcache copy SRC {path}` from its source",
    Code.CACHE_TOO_SMALL: "pin a subset: `hotcache copy SRC DEST --fit` on an SSD filesystem, "
                          "and read the rest from the origin (DATA_COLD_ROOT)",
    Code.NO_ROOM_TO_REFRESH: "make room (`hotcache prune`), or copy with `--fit`",
    Code.WAITING_FOR_SSD: "name a new SSD as the cache device in {name}'s spec and run "
                          "`hotcache apply SPEC`: a new cache is attached to the filesystem "
                          "the origin kept; `hotcache teardown {name} --forget` drops the "
                          "record instead",
    Code.THRASHING: "`hotcache status --interval 60` shows promotions against demotions; "
                    "pin a subset with `hotcache copy --fit`",
}


# The fix for CACHE_FAILED where the watcher switched the cache to its origin: nothing
# is left to take apart there.
ON_ORIGIN = ("{name} runs on its origin, every file intact. Name a new SSD as the cache "
             "device in its spec and `hotcache apply SPEC` attaches a new cache to the "
             "filesystem (dm-cache: under the mounted filesystem, or, after a reboot, with "
             "it unmounted for a moment, so stop its readers then; lvmcache: run `hotcache "
             "teardown {name} --cache-failed` first, which unmounts it)")


def advice(code: str, **facts: object) -> str:
    return ADVICE[code].format(**facts)


@dataclass
class Finding:
    check: str
    severity: str
    subject: str
    message: str
    fix: str | None = None
    code: str | None = None     # a Code (or a status Code for drift); None for ok findings

    @classmethod
    def coded(cls, check: str, severity: str, subject: str, message: str, code: str,
              **facts: object) -> Finding:
        """A finding whose fix is ADVICE[code], filled with `facts`."""
        return cls(check, severity, subject, message, advice(code, **facts), str(code))


@dataclass
class Options:
    state: Path
    fstab: Path | None              # hotcache's fstab (HOTCACHE_FSTAB); None: as recorded
    system_fstab: Path              # /etc/fstab: other entries for hotcache mountpoints
    unit_dir: Path                  # where systemd units (restore, metrics) live
    min_free_percent: float = 10.0
    max_verify_age_days: float = 7.0


def run(opts: Options, runner: Runner | None = None) -> list[Finding]:
    runner = runner or Runner()
    try:
        data = mapping.load(opts.state)
        caches = data["caches"]
    except HotcacheError as exc:
        return [Finding.coded("mapping", PROBLEM, str(opts.state), exc.message,
                              Code.MAPPING_UNREADABLE,
                              hint=exc.hint or f"fix or move away {opts.state}")]
    rows = {name: cache_status(name, entry, runner, opts.fstab) for name, entry in caches.items()}
    findings = [
        *check_kernel(caches),
        *check_programs(caches),
        *check_nofail(caches, opts),
        *check_boot_restore(caches, opts.unit_dir),
        *check_restore_failed(caches, runner),
        *check_drift(rows),
        *check_space_and_copies(caches, rows, opts),
        *check_working_set(rows),
        *check_waiting_for_ssd(data),
    ]
    if os.geteuid() != 0:
        findings.insert(0, Finding.coded("root", WARNING, "doctor",
                                         "not run as root: on-disk signatures and filesystem "
                                         "UUIDs could not all be read, so drift findings may "
                                         "be wrong", Code.NOT_ROOT))
    return findings


def check_waiting_for_ssd(data: dict[str, Any]) -> list[Finding]:
    """Caches whose failed SSD a teardown took off: their data waits on the origin."""
    return [Finding.coded("cache", WARNING, w["name"],
                          f"{w['name']} has no cache: its failed SSD was taken off, and its "
                          f"origin {w['origin']} keeps the filesystem {w['filesystem_uuid']}, "
                          "without a cache", Code.WAITING_FOR_SSD, name=w["name"])
            for w in waiting(data)]


def used_backends(caches: dict[str, CacheEntry]) -> set[str]:
    return {e.backend for e in caches.values()}


def check_kernel(caches: dict[str, CacheEntry]) -> list[Finding]:
    kernel_has = Host().kernel_has
    out = []
    used = used_backends(caches)
    for feature in sorted(set(KERNEL_FEATURE.values())):
        backends = sorted(b for b, f in KERNEL_FEATURE.items() if f == feature)
        users = sorted(n for n, e in caches.items() if e.backend in backends)
        if kernel_has(feature):
            out.append(Finding("kernel", OK, feature, f"the kernel has {feature} "
                               f"({', '.join(backends)} can run)"))
        elif users:
            out.append(Finding.coded("kernel", PROBLEM, feature,
                                     f"the kernel has no {feature}, but {', '.join(users)} "
                                     f"use{'s' if len(users) == 1 else ''} it: the cache "
                                     "cannot come up", Code.KERNEL_FEATURE_MISSING,
                                     kernel_fix=KERNEL_FIX[feature]))
        elif used & set(backends):
            continue
        else:
            out.append(Finding.coded("kernel", OK, feature, f"no {feature} in this kernel: "
                                     f"{', '.join(backends)} unavailable (no cache uses it)",
                                     Code.KERNEL_FEATURE_UNUSED,
                                     kernel_fix=KERNEL_FIX[feature]))
    return out


def check_programs(caches: dict[str, CacheEntry]) -> list[Finding]:
    used = used_backends(caches) | {PLAIN}
    out = []
    for name in BACKENDS:
        programs = BACKENDS[name].programs if block_cache(name) else BASE_PROGRAMS
        missing = [p for p in dict.fromkeys(programs) if which(p) is None]
        if not missing:
            out.append(Finding("programs", OK, name, f"programs for backend {name} are installed"))
            continue
        packages = " ".join(sorted({PACKAGES.get(p, p) for p in missing}))
        if name in used:
            out.append(Finding.coded("programs", PROBLEM, name,
                                     f"backend {name} is in use but {', '.join(missing)} "
                                     f"{'is' if len(missing) == 1 else 'are'} not installed",
                                     Code.PROGRAMS_MISSING, packages=packages))
        else:
            fix = advice(Code.PROGRAMS_UNUSED, packages=packages)
            out.append(Finding("programs", OK, name, f"backend {name} is not in use; it would "
                               f"need {', '.join(missing)} ({fix})", fix, Code.PROGRAMS_UNUSED))
    return out


def _fstab_lines(path: Path) -> Iterator[tuple[int, str, str, list[str]]]:
    """(line number, device, mountpoint, options) of each entry in an fstab file."""
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if len(fields) >= 4 and not fields[0].startswith("#"):
            mp = fields[1].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
            yield n, fields[0], os.path.normpath(mp), fields[3].split(",")


def check_nofail(caches: dict[str, CacheEntry], opts: Options) -> list[Finding]:
    """Every boot-time mount of a hotcache filesystem (or of a folder inside one) must
    have `nofail`: otherwise a late or dead SSD drops the host into emergency mode."""
    mounts = {os.path.normpath(e.filesystem.mountpoint): name for name, e in caches.items()}
    files = {opts.system_fstab}
    for entry in caches.values():
        recorded = entry.persist and entry.persist.fstab
        if recorded:
            files.add(Path(opts.fstab or recorded))
    out = []
    for path in sorted(files, key=str):
        for n, device, mp, options in _fstab_lines(path):
            owner = next((name for root, name in mounts.items()
                          if mp == root or mp.startswith(root + "/")), None)
            if owner is None:
                continue
            if "nofail" in options:
                out.append(Finding("nofail", OK, f"{path}:{n}", f"{mp} ({owner}) mounts with nofail"))
                continue
            own = fstab.read_entry(path, owner, caches[owner].filesystem.uuid, [mp]) is not None
            out.append(Finding.coded(
                "nofail", PROBLEM, f"{path}:{n}",
                f"{path} line {n} mounts {device} on {mp} (cache {owner}) without nofail: "
                "if the device is late or gone at boot, the host stops in emergency mode",
                Code.NO_NOFAIL, line=n, path=path,
                own=" (or run `hotcache apply SPEC`, which rewrites its own entry)" if own else ""))
    return out


def restore_installed(unit_dir: Path, name: str) -> list[str]:
    """Other unit files or udev rules that run `hotcache restore` for cache `name` (named,
    or with no name: every cache) at boot."""
    candidates = [*glob.glob(str(unit_dir / "*.service"))]
    for d in UDEV_RULE_DIRS:
        candidates += glob.glob(os.path.join(d, "*hotcache*.rules"))
    found = []
    for path in candidates:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        if any(m.group("cache") in (None, name) for m in RESTORE_COMMAND.finditer(text)):
            found.append(path)
    return sorted(found)


def check_boot_restore(caches: dict[str, CacheEntry], unit_dir: Path) -> list[Finding]:
    """bcache tunables and raw dm-cache tables need `hotcache restore` at boot: apply
    installs hotcache-restore-NAME.service (provision/restore.py) and enables it."""
    out = []
    for name, entry in sorted(caches.items()):
        backend = entry.backend
        if backend not in RESTORE_NEEDED:
            continue
        tunables = entry.tunables or {}
        if BACKENDS[backend].boot_loses_tunables_only and not tunables:
            continue  # nothing to restore
        unit = unit_dir / unit_name(name)
        wants = unit_dir / "local-fs.target.wants" / unit.name
        why = RESTORE_NEEDED[backend].format(what=", ".join(f"{k}={v}" for k, v in
                                                            sorted(tunables.items())))
        if unit.is_file() and wants.is_symlink():
            out.append(Finding("boot-restore", OK, name, f"{unit} restores {name} at boot"))
        elif unit.is_file():
            out.append(Finding.coded("boot-restore", PROBLEM, name,
                                     f"{name} ({backend}): {why}, and {unit} is installed but "
                                     "not enabled", Code.RESTORE_NOT_ENABLED, unit=unit.name))
        elif others := restore_installed(unit_dir, name):
            out.append(Finding("boot-restore", OK, name,
                               f"{', '.join(others)} runs `hotcache restore` at boot"))
        else:
            out.append(Finding.coded("boot-restore", PROBLEM, name,
                                     f"{name} ({backend}): {why}, and nothing in {unit_dir} or "
                                     "the udev rules runs `hotcache restore` at boot",
                                     Code.RESTORE_MISSING, unit=unit.name))
    return out


def check_restore_failed(caches: dict[str, CacheEntry], runner: Runner) -> list[Finding]:
    """A restore that failed at this boot: the cache is not there and its mount did not
    happen (the fstab entry requires the restore unit)."""
    out = []
    for name, entry in sorted(caches.items()):
        if not BACKENDS.get(entry.backend) or not BACKENDS[entry.backend].restores_at_boot:
            continue
        why = restorelog.failure(name, runner)
        if why:
            out.append(Finding.coded("boot-restore", PROBLEM, name, f"{name}: {why}",
                                     Code.RESTORE_FAILED, unit=unit_name(name), name=name))
    return out


def check_drift(rows: dict[str, StatusRow]) -> list[Finding]:
    out = []
    for name, row in sorted(rows.items()):
        if row["ok"]:
            out.append(Finding("drift", OK, name, f"{name} matches the mapping"))
        failed = row["cache_failed"]
        moved = failed is not None and failed.get("on_origin_since") is not None
        for problem in row["findings"]:
            code = problem["code"]
            fix = ON_ORIGIN.format(name=name) if moved and code == Drift.CACHE_FAILED \
                else advice(code, name=name, mountpoint=row["mountpoint"])
            out.append(Finding("drift", PROBLEM, name, f"{name}: {problem['message']}", fix,
                               code))
    return out


def check_space_and_copies(caches: dict[str, CacheEntry], rows: dict[str, StatusRow],
                           opts: Options) -> list[Finding]:
    out = []
    now = time.time()
    max_age = opts.max_verify_age_days * 86400
    for name, row in sorted(rows.items()):
        if not row["mounted"] or not row["size_bytes"]:
            continue
        free, size = row["free_bytes"], row["size_bytes"]
        if free is None or not size:   # both come from one statvfs: never one alone
            continue
        # A failed cache's filesystem answers with I/O errors: only recorded copies.
        copies = hot_copies(caches[name], not row["cache_failed"])
        share = 100.0 * free / size
        if share < opts.min_free_percent:
            held = sum(c["bytes"] or 0 for c in copies)
            out.append(Finding.coded(
                "free-space", PROBLEM, name,
                f"{row['mountpoint']} ({name}) has {free / 2**20:.0f} MiB free of "
                f"{size / 2**20:.0f} MiB ({share:.1f} %, below {opts.min_free_percent:g} %); "
                f"{len(copies)} hot copies hold {held / 2**20:.0f} MiB: new copies and "
                "re-copies will not fit", Code.LOW_FREE_SPACE))
        else:
            out.append(Finding("free-space", OK, name, f"{row['mountpoint']}: {share:.0f} % free"))
        for c in copies:
            where = f"hot copy {c['name']} at {c['path']}"
            if c["state"].published and not c["recorded"]:
                out.append(Finding.coded("hot-copy", WARNING, c["path"],
                                         f"{c['path']} holds hot-copy metadata, but hotcache "
                                         "did not record a copy there (made by someone else, "
                                         "or swapped in since): it is published nowhere",
                                         Code.HOT_COPY_UNRECORDED, path=c["path"]))
            elif not c["state"].published:
                out.append(Finding.coded("hot-copy", PROBLEM, c["path"],
                                         f"{where} is recorded but {c['state']} (no complete "
                                         "copy is there)",
                                         Code.HOT_COPY_MISSING, path=c["path"]))
            elif c["state"] == CopyState.FAILED_VERIFICATION:
                out.append(Finding.coded("hot-copy", PROBLEM, c["path"],
                                         f"{where} failed its last verification: some files "
                                         "differ from the manifest",
                                         Code.HOT_COPY_FAILED_VERIFICATION, path=c["path"]))
            elif c["verified_at"] is None or now - c["verified_at"] > max_age:
                age = "never" if c["verified_at"] is None else \
                    f"{(now - c['verified_at']) / 86400:.0f} days ago"
                out.append(Finding.coded("hot-copy", WARNING, c["path"],
                                         f"{where} was last verified {age} (limit "
                                         f"{opts.max_verify_age_days:g} days)",
                                         Code.HOT_COPY_VERIFY_OLD, path=c["path"]))
            else:
                out.append(Finding("hot-copy", OK, c["path"], f"{where} verified"))
    return out


def check_working_set(rows: dict[str, StatusRow]) -> list[Finding]:
    """What each cache is to hold against its fast tier (status' working_set): a block
    cache smaller than its data thrashes, a plain SSD's hot copies need room to refresh."""
    out = []
    for name, row in sorted(rows.items()):
        sizing, activity = row["working_set"]["sizing"], row["working_set"]["activity"]
        if sizing is not None:
            message = f"{name}: {sizing['message']}"
            if sizing["case"] == FITS:
                out.append(Finding("sizing", OK, name, message))
            else:
                out.append(Finding.coded("sizing", WARNING, name, message,
                                         Code.CACHE_TOO_SMALL if block_cache(row["backend"])
                                         else Code.NO_ROOM_TO_REFRESH))
        if activity is not None and activity["verdict"] == "thrashing":
            out.append(Finding.coded("thrashing", WARNING, name, f"{name}: {activity['message']}",
                                     Code.THRASHING))
    return out


class Report(TypedDict):
    """doctor's findings as `doctor --json` prints them."""
    ok: bool
    problems: int
    warnings: int
    findings: list[dict[str, Any]]          # each Finding, as dataclasses.asdict makes it


def report(findings: list[Finding]) -> Report:
    problems = sum(f.severity == PROBLEM for f in findings)
    return {"ok": problems == 0, "problems": problems,
            "warnings": sum(f.severity == WARNING for f in findings),
            "findings": [asdict(f) for f in findings]}
