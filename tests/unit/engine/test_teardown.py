"""The decisions teardown's plan is built from, each on its own: which flag pairs are
refused, when a cache that is not live is refused, what is said about a mount other
namespaces hold, and what becomes of a loop image."""

from __future__ import annotations

import pytest

from hotcache.provision.engine.teardown import (_image_fate, _refuse_flags,
                                                _refuse_if_not_live, _shared_mount_notes)
from hotcache.provision.errors import ExitCode, RefusedError, UsageError


def test_wipe_with_forget_is_bad_input():
    with pytest.raises(UsageError, match="--forget touches no device") as exc:
        _refuse_flags("c1", wipe=True, forget=True, detached=False)
    assert exc.value.exit_code == ExitCode.BAD_INPUT


def test_wipe_on_an_origin_waiting_for_a_new_ssd_is_refused():
    with pytest.raises(RefusedError, match="c1's origin holds the filesystem kept") as exc:
        _refuse_flags("c1", wipe=True, forget=False, detached=True)
    assert "without --wipe" in (exc.value.hint or "")


@pytest.mark.parametrize("forget,detached", [(False, False), (True, True), (True, False),
                                             (False, True)])
def test_without_wipe_every_flag_pair_passes(forget, detached):
    _refuse_flags("c1", wipe=False, forget=forget, detached=detached)


def test_wipe_alone_passes():
    _refuse_flags("c1", wipe=True, forget=False, detached=False)


def test_a_cache_that_is_not_live_is_refused_with_the_backends_reason():
    with pytest.raises(RefusedError, match="c1 is not live: tables not loaded") as exc:
        _refuse_if_not_live("c1", "tables not loaded")
    assert "`hotcache restore c1`" in (exc.value.hint or "")


@pytest.mark.parametrize("why", [None, ""])
def test_a_live_cache_passes(why):
    _refuse_if_not_live("c1", why)


def test_no_note_when_no_other_namespace_holds_the_mount():
    assert _shared_mount_notes("/mnt/c1", []) == []


def test_the_note_names_at_most_five_holders():
    held = [f"pid {i}" for i in range(7)]
    [note] = _shared_mount_notes("/mnt/c1", held)
    assert note.startswith("/mnt/c1 is also mounted in other mount namespaces")
    assert "pid 4: its device stays in use" in note
    assert "pid 5" not in note


@pytest.mark.parametrize("image,remove,exists,fate", [
    (None, True, False, None),                      # no loop image
    ("", True, True, None),
    ("/var/lib/c1.img", True, False, None),         # gone already: nothing to delete or keep
    ("/var/lib/c1.img", False, False, None),
    ("/var/lib/c1.img", True, True, "delete"),      # --remove-images
    ("/var/lib/c1.img", False, True, "keep"),       # kept, and the mapping goes on knowing it
])
def test_image_fate(image, remove, exists, fate):
    assert _image_fate(image, remove_images=remove, exists=exists) == fate
