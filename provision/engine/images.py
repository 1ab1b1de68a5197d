"""Loop images that outlive their cache.

`hotcache teardown` detaches a loop-backed cache's image and, unless told to delete it
(`--remove-images`), keeps the file with its data. The mapping keeps a record of it under
`kept_images` (image path -> the cache, backend, filesystem UUID, when, and the file's
identity: st_dev, inode and size), so that the image is still known as hotcache's own: an
apply of a backend `none` spec naming it again mounts the same filesystem (the data is
still there) instead of refusing it as foreign. A path is not an identity: another file
put there since (a copy, a restore from backup, someone else's image) is not hotcache's.
A block-cache image (bcache, dm-cache metadata) is not adopted this way: rebuilding one
needs `wipe: true`, which the teardown message says.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TypedDict

from hotcache.provision.backends import PLAIN
from hotcache.provision.system.clock import now
from hotcache.provision.errors import RefusedError
from hotcache.provision.records import CacheEntry, DeviceRecord, EntryState, Filesystem

KEY = "kept_images"

if TYPE_CHECKING:
    from hotcache.provision.engine.spec import CacheSpec


class FileIdentity(TypedDict):
    """What tells one file from another at the same path."""
    st_dev: int
    inode: int
    size: int


def file_identity(path: str) -> FileIdentity | None:
    """What tells one file from another at the same path (None: no file there)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return {"st_dev": st.st_dev, "inode": st.st_ino, "size": st.st_size}


def record(data: dict[str, Any], image: str, cache: str, entry: CacheEntry, role: str) -> None:
    """Note in the mapping `data` that `image` was kept when `cache` was taken down."""
    data.setdefault(KEY, {})[os.path.realpath(image)] = {
        "cache": cache, "backend": entry.backend, "role": role,
        "fs_uuid": entry.filesystem.uuid, "kept": now(),
        "file": file_identity(image),
    }


def other_file(image: str, kept: dict[str, Any]) -> str | None:
    """Why the file now at `image` is not the one kept (None: it is). A record without
    the file's identity proves nothing (fail closed)."""
    want, have = kept.get("file"), file_identity(image)
    if not want:
        return "the mapping recorded no file identity for it"
    if have is None:
        return "no file is there now"
    diff = [f"{k} {have[k]}, recorded {want.get(k)}" for k in ("st_dev", "inode", "size")
            if have[k] != want.get(k)]
    return "; ".join(diff) or None


def forget(data: dict[str, Any], image: str) -> None:
    kept = data.get(KEY) or {}
    kept.pop(os.path.realpath(image), None)
    if not kept:
        data.pop(KEY, None)


def adoptable_entry(data: dict[str, Any], spec: CacheSpec) -> CacheEntry | None:
    """For a backend `none` spec whose image hotcache kept at a teardown: the entry that
    lets apply recognise the filesystem on it as its own (the UUID it recorded)."""
    origin = spec.origin
    if spec.backend != PLAIN or origin.loop is None:
        return None
    image = os.path.realpath(origin.loop.file)
    kept = (data.get(KEY) or {}).get(image)
    if not kept or kept.get("backend") != PLAIN or not kept.get("fs_uuid"):
        return None
    why = other_file(image, kept)
    if why and origin.wipe:
        return None             # consent to erase whatever file is there now
    if why:
        raise RefusedError(
            f"{spec.name}: {image} is not the image hotcache kept when {kept.get('cache')} "
            f"was taken down ({why}): another file was put at that path, so hotcache does "
            "not mount, format or attach it; nothing was changed",
            hint="put the kept image back, or, to build a new cache on this file and lose "
                 "what it holds, give the origin `wipe: true`")
    # Never saved (apply records the cache anew): only what apply reads to know the image.
    recorded = DeviceRecord.model_construct(node=None, size=None, by_id=None, identity=None,
                                            path=None, loop_file=image)
    return CacheEntry.model_construct(
        backend=PLAIN, state=EntryState.KEPT, devices={"origin": recorded}, backend_state=None,
        filesystem=Filesystem.model_construct(uuid=kept["fs_uuid"], mountpoint=None), spec={})


def made_by_hotcache(data: dict[str, Any], cache: str) -> set[str]:
    """Image files (real paths) the mapping records as hotcache's for `cache`: those its
    entry names, and those a teardown kept. Any other existing image with data in it is
    not hotcache's to format without `wipe: true`."""
    entry = data.get("caches", {}).get(cache)
    made = {os.path.realpath(info.loop_file) for info in (entry.devices if entry else {}).values()
            if info.loop_file}
    kept = {image for image, info in (data.get(KEY) or {}).items()
            if isinstance(info, dict) and other_file(image, info) is None}
    return made | kept
