"""Loop images that outlive their cache.

`hotcache teardown` detaches a loop-backed cache's image and, unless told to delete it
(`--remove-images`), keeps the file with its data. The mapping keeps a record of it under
`kept_images` (image path -> the cache, backend, filesystem UUID, when), so that the
image is still known as hotcache's own: an apply of a backend `none` spec naming it again
mounts the same filesystem (the data is still there) instead of refusing it as foreign.
A block-cache image (bcache, dm-cache metadata) is not adopted this way: rebuilding one
needs `wipe: true`, which the teardown message says.
"""

from __future__ import annotations

import os

from hotcache.provision import mapping

KEY = "kept_images"


def record(data: dict, image: str, cache: str, entry: dict, role: str) -> None:
    """Note in the mapping `data` that `image` was kept when `cache` was taken down."""
    data.setdefault(KEY, {})[os.path.realpath(image)] = {
        "cache": cache, "backend": entry.get("backend"), "role": role,
        "fs_uuid": entry.get("filesystem", {}).get("uuid"), "kept": mapping.now(),
    }


def forget(data: dict, image: str) -> None:
    kept = data.get(KEY) or {}
    kept.pop(os.path.realpath(image), None)
    if not kept:
        data.pop(KEY, None)


def adoptable_entry(data: dict, spec) -> dict | None:
    """For a backend `none` spec whose image hotcache kept at a teardown: the entry that
    lets apply recognise the filesystem on it as its own (the UUID it recorded)."""
    origin = spec.origin
    if spec.backend != "none" or origin.loop is None:
        return None
    kept = (data.get(KEY) or {}).get(os.path.realpath(origin.loop.file))
    if not kept or kept.get("backend") != "none" or not kept.get("fs_uuid"):
        return None
    # The image file is the device's identity: recorded as such, apply finds it proven.
    return {"backend": "none", "state": "kept", "filesystem": {"uuid": kept["fs_uuid"]},
            "devices": {"origin": {"loop_file": os.path.realpath(origin.loop.file)}}}


def made_by_hotcache(data: dict, cache: str) -> set[str]:
    """Image files (real paths) the mapping records as hotcache's for `cache`: those its
    entry names, and those a teardown kept. Any other existing image with data in it is
    not hotcache's to format without `wipe: true`."""
    entry = data.get("caches", {}).get(cache) or {}
    made = {os.path.realpath(info["loop_file"]) for info in (entry.get("devices") or {}).values()
            if isinstance(info, dict) and info.get("loop_file")}
    return made | set(data.get(KEY) or {})
