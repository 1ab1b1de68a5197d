"""One hot-copy state (hotcopy/format.copy_state) read by all who report on copies:
`hotcache copies` (catalog), the metrics and node labels, doctor, and the adapters'
DATA_ROOT line. The same folders on disk must give the same answer everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hotcache.adapters.dataroot import hot_copy_at
from hotcache.provision.hotcopy import catalog
from hotcache.provision.hotcopy.format import METADATA, CopyState, copy_state, staging_dir
from hotcache.provision.observe import doctor, metrics
from tests.helpers import entry_record
from tests.unit.observe.test_metrics import make_copy

WHEN = "2027-01-15T00:00:00+00:00"


def staging(dest: Path) -> None:
    staging_dir(dest).mkdir(mode=0o700)


def incomplete(dest: Path) -> None:
    """A copy killed before its metadata said complete."""
    make_copy(dest, verify_ok=None, verified_at=None)
    meta = json.loads((dest / METADATA).read_text())
    (dest / METADATA).write_text(json.dumps({**meta, "complete": False}))
    staging(dest)


CASES = {   # on-disk state -> (how to make it, the state, metrics' verify_ok, the adapters')
    "complete, verified": (lambda d: make_copy(d, verified_at=WHEN),
                           CopyState.VERIFIED, True, "hot"),
    "complete, never verified": (lambda d: make_copy(d, verify_ok=None, verified_at=None),
                                 CopyState.NOT_VERIFIED, None, "unverified"),
    "verify_ok without a time": (lambda d: make_copy(d, verify_ok=True, verified_at=None),
                                 CopyState.NOT_VERIFIED, None, "unverified"),
    "failed verification": (lambda d: make_copy(d, verify_ok=False),
                            CopyState.FAILED_VERIFICATION, False, "unverified"),
    "verified, refreshing": (lambda d: (make_copy(d), staging(d)),
                             CopyState.VERIFIED_REFRESH_INTERRUPTED, True, "hot"),
    "unverified, refreshing": (lambda d: (make_copy(d, verify_ok=None, verified_at=None),
                                          staging(d)),
                               CopyState.REFRESH_INTERRUPTED, None, "unverified"),
    "staging, nothing published": (lambda d: (d.mkdir(), staging(d)),
                                   CopyState.INTERRUPTED, False, "staging"),
    "killed before complete": (incomplete, CopyState.INTERRUPTED, False, "staging"),
    "missing": (lambda d: d.mkdir(), CopyState.MISSING, False, "cold"),
}
DOCTOR = {CopyState.VERIFIED: None, CopyState.VERIFIED_REFRESH_INTERRUPTED: None,
          CopyState.NOT_VERIFIED: doctor.Code.HOT_COPY_VERIFY_OLD,
          CopyState.REFRESH_INTERRUPTED: doctor.Code.HOT_COPY_VERIFY_OLD,
          CopyState.FAILED_VERIFICATION: doctor.Code.HOT_COPY_FAILED_VERIFICATION,
          CopyState.INTERRUPTED: doctor.Code.HOT_COPY_MISSING,
          CopyState.MISSING: doctor.Code.HOT_COPY_MISSING}


def doctor_code(dest: Path) -> str | None:
    caches = {"data": entry_record("data", hot_copies={str(dest): {"name": "imagenet"}})}
    rows = {"data": {"mounted": True, "size_bytes": 100, "free_bytes": 50, "mountpoint": "/x",
                     "cache_failed": None}}
    opts = doctor.Options(Path("m.yaml"), None, Path("fstab"), Path("units"),
                          max_verify_age_days=1e9)
    (found,) = [f for f in doctor.check_space_and_copies(caches, rows, opts)
                if f.check == "hot-copy"]
    return found.code


@pytest.mark.parametrize("case", CASES)
def test_every_reader_agrees_on_the_state(tmp_path, case):
    make, state, verify_ok, level = CASES[case]
    dest = tmp_path / "hot" / "imagenet"
    dest.parent.mkdir()
    make(dest)
    assert copy_state(dest)[0] == state
    assert catalog.describe(dest)["state"] == state.value           # `hotcache copies`
    (row,) = metrics.hot_copies(entry_record(hot_copies={str(dest): {}}), False)
    assert (row["state"], row["present"], row["verify_ok"]) == (state, state.published, verify_ok)
    seen = hot_copy_at(dest)                                          # the adapters
    assert seen.state == level
    assert seen.copy_state == (None if level == "cold" else state.value)
    assert doctor_code(dest) == DOCTOR[state]


def test_the_adapters_inside_a_staging_folder_see_staging(tmp_path):
    dest = tmp_path / "imagenet"
    dest.mkdir()
    staging(dest)
    inner = staging_dir(dest) / "part"
    inner.mkdir()
    assert hot_copy_at(inner).state == "staging"
    assert copy_state(staging_dir(dest))[0] == CopyState.INTERRUPTED
    assert catalog.describe(staging_dir(dest))["state"] == "interrupted"


def test_every_state_is_covered():
    assert {c[1] for c in CASES.values()} == set(CopyState) == set(DOCTOR)
