"""The host spec: what the administrator wants to exist, read from YAML and validated.

Two passes. The structural pass (pydantic) checks types, required fields and unknown
keys; the semantic pass checks the host (devices exist, names and mountpoints unique,
options that make sense together). Every problem is reported as `yaml.path: what`, all
at once, so a spec can be fixed in one go. Nothing here touches the host's state.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hotcache.provision.backends import BACKENDS
from hotcache.provision.errors import SpecError
from hotcache.provision.system import sizes
from hotcache.provision.system.users import parse_owner

SPEC_VERSION: Final = 1
# Options that contradict `noatime`, which hotcache always sets (reads must not write).
ATIME_OPTIONS = {"atime", "strictatime", "relatime", "lazytime"}
SYSTEM_DIRS = {"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/proc",
               "/root", "/run", "/sbin", "/sys", "/tmp", "/usr", "/var"}

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def spec_size(value: int | str) -> int:
    """'2G', '512MiB', '1.5T' or an int of bytes -> bytes (binary multiples)."""
    if isinstance(value, bool):
        raise ValueError("size must be a number of bytes or a string like 2G")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("size must be positive")
        return value
    try:
        return sizes.parse_size(str(value))
    except ValueError as exc:
        raise ValueError(f"size {exc}") from None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoopImage(Strict):
    file: str = Field(description="Image file; created sparse if missing, attached with losetup.")
    size: int | str = Field(description="Image size when created: bytes or 512M, 2G, 1T.")

    @field_validator("file")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not os.path.isabs(v):
            raise ValueError(f"loop image file {v!r} must be an absolute path")
        return v

    @field_validator("size")
    @classmethod
    def _size(cls, v: int | str) -> int | str:
        spec_size(v)
        return v

    @property
    def bytes(self) -> int:
        return spec_size(self.size)


class DeviceRef(Strict):
    """A block device: a path (/dev/sdb, /dev/md0, /dev/disk/by-id/...) or a loop image."""

    path: str | None = Field(None, description="Device node or /dev/disk/by-id link.")
    loop: LoopImage | None = Field(None, description="A loop-backed image file (for trials).")
    wipe: bool = Field(False, description="Consent to erase existing signatures on it.")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"path": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _exactly_one(self) -> "DeviceRef":
        if (self.path is None) == (self.loop is None):
            raise ValueError("give exactly one of `path` or `loop`")
        if self.path is not None and not self.path.startswith("/dev/"):
            raise ValueError(f"device path {self.path!r} must start with /dev/")
        return self

    @property
    def file(self) -> str:
        """What hotcache opens: the device path, or the loop image's file."""
        if self.loop is not None:
            return self.loop.file
        if self.path is None:       # _exactly_one refuses this
            raise ValueError("give exactly one of `path` or `loop`")
        return self.path

    @property
    def label(self) -> str:
        return self.path if self.path else f"loop image {self.file}"


class Filesystem(Strict):
    type: Literal["xfs"] = Field("xfs", description="Only XFS: it is what hotcache formats.")
    label: str | None = Field(None, description="XFS label, at most 12 characters.")
    mountpoint: str = Field(description="Absolute path where the filesystem is mounted.")
    options: list[str] = Field(default_factory=list,
                               description="Extra mount options; noatime is always added.")
    nosuid_nodev: bool = Field(
        True, description="Mount with nosuid,nodev (the default): a setuid program or a "
                          "device node on the hot tier gives no privilege, whoever put it "
                          "there. false: mount without them (and say why in the spec).")
    owner: str | None = Field(None, description="user[:group] that owns the mountpoint.")
    mode: str | None = Field(None, description="Octal mode of the mountpoint, e.g. '2775'.")
    persist: Literal["fstab", "none"] = Field(
        "fstab", description="fstab: an entry by UUID with nofail, so it is mounted at boot.")
    device_timeout: int = Field(30, ge=1, le=3600,
                                description="Seconds systemd waits for the device at boot.")


class CacheSpec(Strict):
    name: str = Field(description="Unique name: letters, digits, '-' and '_'.")
    backend: Literal[tuple(BACKENDS)] = Field(  # type: ignore[valid-type]
        description="none = XFS straight on the SSD; bcache, dm-cache or lvmcache put the "
                    "SSD in front of the origin.")
    origin: DeviceRef = Field(description="The slow device (HDD, md array); for backend "
                                          "none, the SSD the filesystem goes on.")
    cache: DeviceRef | None = Field(None, description="The fast device (SSD); absent for none.")
    mode: str | None = Field(None, description="Cache mode; writethrough by default.")
    tunables: dict[str, int | str] = Field(default_factory=dict,
                                           description="Backend tunables, e.g. sequential_cutoff.")
    filesystem: Filesystem

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", v):
            raise ValueError(f"name {v!r} must be 1-32 letters, digits, '-' or '_'")
        return v

    @property
    def effective_mode(self) -> str:
        return self.mode or BACKENDS[self.backend].default_mode()

    def devices(self) -> dict[str, DeviceRef]:
        return {"origin": self.origin, **({"cache": self.cache} if self.cache else {})}


class HostSpec(Strict):
    version: Literal[1] = Field(default=SPEC_VERSION, description="Spec format version.")
    caches: list[CacheSpec] = Field(description="The caches this host should have.")


def json_schema() -> dict:
    schema = _device_shorthand(HostSpec.model_json_schema())
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "hotcache host spec"
    return schema


def _device_shorthand(node):
    """A device may be written as its path alone (`origin: /dev/sdb`): DeviceRef's
    `before` validator accepts that, but pydantic's schema only shows the object form."""
    if isinstance(node, list):
        return [_device_shorthand(n) for n in node]
    if not isinstance(node, dict):
        return node
    if node.get("$ref") == "#/$defs/DeviceRef":
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return {**rest, "anyOf": [{"type": "string", "pattern": "^/dev/"},
                                  {"$ref": "#/$defs/DeviceRef"}]}
    return {k: _device_shorthand(v) for k, v in node.items()}


def yaml_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _structural(raw: Any, source: str) -> HostSpec:
    if not isinstance(raw, dict):
        raise SpecError(source, ["(top level): must be a mapping with `caches:`"],
                        hint="start from a file in examples/")
    try:
        return HostSpec.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            # Drop pydantic's internal loc parts (validator names) to keep the YAML path.
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key (check its spelling; see `hotcache schema`)"
            elif err["type"] == "missing":
                msg = "required key is missing"
            problems.append(f"{yaml_path(loc)}: {msg}")
        raise SpecError(source, problems, hint="fix these and run `hotcache plan` again") from None


def _semantic(spec: HostSpec) -> list[str]:
    """What the schema cannot say: each cache's fit with its backend and its
    filesystem, and no name, device or mountpoint used twice."""
    problems: list[str] = []
    seen_names: dict[str, int] = {}
    seen_mounts: dict[str, int] = {}
    seen_devices: dict[str, str] = {}
    for i, c in enumerate(spec.caches):
        at = f"caches[{i}]"
        if c.name in seen_names:
            problems.append(f"{at}.name: {c.name!r} is also the name of caches[{seen_names[c.name]}]")
        seen_names.setdefault(c.name, i)
        problems += _check_backend(at, c)
        for role, dev in c.devices().items():
            problems += _check_device(f"{at}.{role}", dev)
            key = os.path.realpath(dev.file)    # x/../a.img is a.img
            if key in seen_devices:
                problems.append(f"{at}.{role}: {dev.label} is also used by {seen_devices[key]}")
            seen_devices.setdefault(key, f"{at}.{role}")
        problems += _check_filesystem(at, i, c, seen_mounts)
    return problems


def _check_backend(at: str, c: CacheSpec) -> list[str]:
    """The cache device, mode and tunables the cache's backend takes."""
    problems: list[str] = []
    backend = BACKENDS[c.backend]
    if not backend.block_cache and c.cache is not None:
        caches = ", ".join(n for n, b in BACKENDS.items() if b.block_cache)
        problems.append(f"{at}.cache: backend {c.backend} puts XFS straight on `origin`; "
                        f"remove `cache` or choose {caches}")
    if backend.block_cache and c.cache is None:
        problems.append(f"{at}.cache: backend {c.backend} needs a cache device (the SSD)")
    if c.mode is not None and c.mode not in backend.modes:
        problems.append(f"{at}.mode: {c.mode!r} is not a {c.backend} mode; "
                        f"use one of {', '.join(backend.modes)}")
    for key, value in c.tunables.items():
        allowed = backend.tunables
        if key not in allowed:
            problems.append(f"{at}.tunables.{key}: not a {c.backend} tunable"
                            + (f"; known: {', '.join(sorted(allowed))}" if allowed else ""))
        elif not isinstance(value, allowed[key]) or isinstance(value, bool):
            problems.append(f"{at}.tunables.{key}: must be {allowed[key].__name__}")
        elif isinstance(value, int) and value < 0:     # an int tunable (checked above)
            problems.append(f"{at}.tunables.{key}: must not be negative")
    return problems


def _check_filesystem(at: str, i: int, c: CacheSpec, seen_mounts: dict[str, int]) -> list[str]:
    """Names fstab and units can carry, the mountpoint (its own, absolute, not a system
    folder, not another cache's), the label, options, owner and mode."""
    problems: list[str] = []
    fs = c.filesystem
    mp = os.path.normpath(fs.mountpoint)
    for field, text in (("filesystem.mountpoint", fs.mountpoint),
                        ("filesystem.label", fs.label),
                        *((f"{role}.loop.file", d.loop.file) for role, d in
                          c.devices().items() if d.loop),
                        *((f"{role}.path", d.path) for role, d in c.devices().items()
                          if d.path)):
        if text is not None and _CONTROL.search(text):
            problems.append(f"{at}.{field}: {text!r} contains a control character "
                            "(newline, tab, ...); fstab, units and logs split on them. "
                            "Rename it")
    if not os.path.isabs(fs.mountpoint):
        problems.append(f"{at}.filesystem.mountpoint: {fs.mountpoint!r} must be an absolute path")
    elif mp in SYSTEM_DIRS:
        problems.append(f"{at}.filesystem.mountpoint: {mp} is a system folder; "
                        "mount the cache on its own folder such as /mnt/hot")
    elif mp in seen_mounts:
        problems.append(f"{at}.filesystem.mountpoint: {mp} is also used by "
                        f"caches[{seen_mounts[mp]}]")
    seen_mounts.setdefault(mp, i)
    if fs.label is not None and (len(fs.label) > 12 or not fs.label.isprintable()
                                 or " " in fs.label):
        problems.append(f"{at}.filesystem.label: {fs.label!r} must be 1-12 characters "
                        "without spaces (an XFS limit)")
    for opt in fs.options:
        if fs.nosuid_nodev and opt in ("suid", "dev"):
            problems.append(f"{at}.filesystem.options: {opt!r} contradicts nosuid_nodev "
                            "(the default); set nosuid_nodev: false instead")
        elif opt.split("=")[0] in ATIME_OPTIONS:
            problems.append(f"{at}.filesystem.options: {opt!r} contradicts noatime, "
                            "which hotcache always sets; remove it")
        elif not re.fullmatch(r"[A-Za-z0-9_.=:/-]+", opt) or opt in ("ro", "rw"):
            problems.append(f"{at}.filesystem.options: {opt!r} is not a mount option "
                            "hotcache can set (one option per list item, not ro/rw)")
    if fs.owner is not None:
        problems += _check_owner(f"{at}.filesystem.owner", fs.owner)
    if fs.mode is not None and not re.fullmatch(r"0?[0-7]{3,4}", fs.mode):
        problems.append(f"{at}.filesystem.mode: {fs.mode!r} must be octal like '0755' or "
                        "'2775' (quote it in YAML)")
    return problems


def _check_device(at: str, dev: DeviceRef) -> list[str]:
    if dev.path is not None:
        if not os.path.exists(dev.path):
            return [f"{at}: device {dev.path} does not exist (see `hotcache devices`)"]
        import stat

        if not stat.S_ISBLK(os.stat(dev.path).st_mode):
            return [f"{at}: {dev.path} is not a block device"]
        return []
    image = Path(dev.file)
    if not image.parent.is_dir():
        return [f"{at}.loop.file: folder {image.parent} does not exist; create it first"]
    if image.exists() and not image.is_file():
        return [f"{at}.loop.file: {image} exists and is not a regular file"]
    return []


def _check_owner(at: str, owner: str) -> list[str]:
    return [f"{at}: {what} does not exist on this host" for what in parse_owner(owner).missing]


def parse_spec(text: str, source: str = "<spec>") -> HostSpec:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SpecError(source, [f"{where}not valid YAML ({getattr(exc, 'problem', exc)})"]) from None
    spec = _structural(raw, source)
    problems = _semantic(spec)
    if problems:
        raise SpecError(source, problems, hint="fix these and run `hotcache plan` again")
    return spec


def load_spec(path: str | os.PathLike) -> HostSpec:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise SpecError(str(p), ["file not found"], hint="give the path of a host spec "
                        "(examples/ has some to start from)") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise SpecError(str(p), [f"cannot read it: {exc}"]) from None
    return parse_spec(text, str(p))


def without_wipe(spec: dict) -> dict:
    """`wipe: true` was consent for the first build; a restore never replays it."""
    out = dict(spec)
    for role in ("origin", "cache"):
        if isinstance(out.get(role), dict):
            out[role] = {k: v for k, v in out[role].items() if k != "wipe"}
    return out
