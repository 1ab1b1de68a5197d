"""The host spec: what the administrator wants to exist, read from YAML and validated.

Two passes. The structural pass (pydantic) checks types, required fields and unknown
keys; the semantic pass checks the host (devices exist, names and mountpoints unique,
options that make sense together) on what the structural pass accepted, even where it
refused other parts. Every problem is reported as `yaml.path: what` at its
`file:line:col` (specsource.py), all at once, so a spec can be fixed in one go. Nothing
here touches the host's state.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hotcache.provision.backends import BACKENDS
from hotcache.provision.engine.specsource import HINT, Document, Loc, Problem, parse_path, yaml_path
from hotcache.provision.errors import SpecError
from hotcache.provision.system import sizes
from hotcache.provision.system.users import parse_owner

SPEC_VERSION: Final = 1
# Options that contradict `noatime`, which hotcache always sets (reads must not write).
ATIME_OPTIONS = {"atime", "strictatime", "relatime", "lazytime"}
SYSTEM_DIRS = {"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/proc",
               "/root", "/run", "/sbin", "/sys", "/tmp", "/usr", "/var"}

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}"
OCTAL_MODE = r"0?[0-7]{3,4}"


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
        if not re.fullmatch(NAME_PATTERN, v):
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


M = TypeVar("M", bound=BaseModel)


def json_schema() -> dict[str, Any]:
    """The spec's JSON Schema, for editors and CI: pydantic's, with the static rules the
    models check in code (a name's pattern, an octal mode) and each backend's modes,
    tunables and cache device, read from the backends' registry."""
    schema: dict[str, Any] = _device_shorthand(HostSpec.model_json_schema())
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "hotcache host spec"
    cache = schema["$defs"]["CacheSpec"]
    cache["properties"]["name"]["pattern"] = f"^{NAME_PATTERN}$"
    modes = sorted({m for b in BACKENDS.values() for m in b.modes})
    cache["properties"]["mode"]["anyOf"][0]["enum"] = modes
    cache["allOf"] = [_backend_rules(name) for name in BACKENDS]
    fs = schema["$defs"]["Filesystem"]["properties"]
    fs["mode"]["anyOf"][0]["pattern"] = f"^{OCTAL_MODE}$"
    fs["label"]["anyOf"][0]["maxLength"] = 12
    return schema


def _backend_rules(name: str) -> dict[str, Any]:
    """If `backend` is this one: its modes, its tunables, and a cache device or none."""
    backend = BACKENDS[name]
    then: dict[str, Any] = {"properties": {
        "mode": {"anyOf": [{"enum": list(backend.modes)}, {"type": "null"}]},
        "tunables": {"propertyNames": {"enum": sorted(backend.tunables)}}}}
    if backend.block_cache:
        then["required"] = ["cache"]
        then["properties"]["cache"] = {"not": {"type": "null"}}
    else:
        then["properties"]["cache"] = {"type": "null"}
    return {"if": {"properties": {"backend": {"const": name}}, "required": ["backend"]},
            "then": then}


def _device_shorthand(node: Any) -> Any:
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


# pydantic's error types that mean "a string was expected here"
_WANTS_TEXT = {"string_type", "string_pattern_mismatch"}


def _structural_problems(raw: Any) -> list[Problem]:
    """The model's complaints (types, required and unknown keys), as problems."""
    if raw is None:
        return [Problem((), "the spec is empty; give a mapping with `caches:` (start from a "
                            "file in examples/)")]
    if not isinstance(raw, dict):
        return [Problem((), "must be a mapping with `caches:` (start from a file in examples/)")]
    try:
        HostSpec.model_validate(raw)
    except ValidationError as exc:
        problems: dict[Loc, Problem] = {}
        for err in exc.errors():
            # Drop pydantic's internal loc parts (validator names) to keep the YAML path.
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
            msg = err["msg"].removeprefix("Value error, ")
            wants_text = err["type"] in _WANTS_TEXT or err["type"] == "literal_error" \
                and "'" in str(err.get("ctx", {}).get("expected", ""))
            if err["type"] == "extra_forbidden":
                msg = "unknown key (check its spelling; see `hotcache schema`)"
            elif err["type"] == "missing":
                msg = "required key is missing"
            else:
                loc = _known_part(raw, loc)
            if loc in problems:   # both sides of `int | str` refused it: one problem
                msg = f"{problems[loc].message} or {msg.removeprefix('Input should be ')}"
                wants_text = wants_text or problems[loc].wants_text
            problems[loc] = Problem(loc, msg, at_key=err["type"] == "extra_forbidden",
                                    wants_text=wants_text)
        return list(problems.values())
    return []


def _known_part(raw: Any, loc: Loc) -> Loc:
    """The start of `loc` that is in the data: pydantic names the sides of a union
    (`size.int`, `size.str`) as if they were keys."""
    node = raw
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return loc[:i]
    return loc


def _structural(raw: Any, source: str) -> HostSpec:
    """The model alone (no check of the host), for a spec that is already data."""
    problems = _structural_problems(raw)
    if problems:
        raise SpecError(source, [f"{yaml_path(p.loc)}: {p.message}" for p in problems],
                        hint=HINT)
    return HostSpec.model_validate(raw)


@dataclass(frozen=True)
class _Parts:
    """What the semantic checks read of one cache: the model's fields, or, where the
    structural pass refused some of them, those that passed (the others are None and
    already reported), so that one run reports every problem."""

    name: str | None
    backend: str | None
    origin: DeviceRef | None
    cache: DeviceRef | None
    given: frozenset[str]           # the keys the spec gives a value, valid or not
    mode: str | None
    tunables: dict[str, Any]
    filesystem: Filesystem | None

    @classmethod
    def of(cls, c: CacheSpec) -> "_Parts":
        return cls(c.name, c.backend, c.origin, c.cache,
                   frozenset(k for k in c.model_fields_set if getattr(c, k) is not None),
                   c.mode, dict(c.tunables), c.filesystem)

    @classmethod
    def salvage(cls, raw: Any) -> "_Parts | None":
        if not isinstance(raw, dict):
            return None
        name, backend, mode, tunables = (raw.get(k) for k in ("name", "backend", "mode",
                                                               "tunables"))
        return cls(
            name if isinstance(name, str) and re.fullmatch(NAME_PATTERN, name) else None,
            backend if isinstance(backend, str) and backend in BACKENDS else None,
            _salvage(DeviceRef, raw.get("origin")), _salvage(DeviceRef, raw.get("cache")),
            frozenset(k for k, v in raw.items() if isinstance(k, str) and v is not None),
            mode if isinstance(mode, str) else None,
            {k: v for k, v in tunables.items() if isinstance(k, str)
             and isinstance(v, (int, str))} if isinstance(tunables, dict) else {},
            _salvage(Filesystem, raw.get("filesystem")))

    def devices(self) -> dict[str, DeviceRef]:
        return {role: dev for role, dev in (("origin", self.origin), ("cache", self.cache))
                if dev is not None}


def _salvage(model: type[M], raw: Any) -> M | None:
    """`model` built from `raw` without the keys it refused; None when what is left is
    not one (a required key refused, a rule between keys broken)."""
    if raw is None:
        return None
    for _ in range(len(raw) + 1 if isinstance(raw, dict) else 1):
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            if not isinstance(raw, dict):
                return None
            bad = {err["loc"][0] for err in exc.errors()
                   if err["loc"] and err["type"] != "missing"}
            if not bad or not bad <= raw.keys():
                return None
            raw = {k: v for k, v in raw.items() if k not in bad}
    return None


def _semantic(caches: list[_Parts | None]) -> list[str]:
    """What the schema cannot say: each cache's fit with its backend and its
    filesystem, and no name, device or mountpoint used twice."""
    problems: list[str] = []
    seen_names: dict[str, int] = {}
    seen_mounts: dict[str, int] = {}
    seen_devices: dict[str, str] = {}
    for i, c in enumerate(caches):
        if c is None:
            continue
        at = f"caches[{i}]"
        if c.name is not None:
            if c.name in seen_names:
                problems.append(f"{at}.name: {c.name!r} is also the name of "
                                f"caches[{seen_names[c.name]}]")
            seen_names.setdefault(c.name, i)
        problems += _check_backend(at, c)
        for role, dev in c.devices().items():
            problems += _check_device(f"{at}.{role}", dev)
            key = os.path.realpath(dev.file)    # x/../a.img is a.img
            if key in seen_devices:
                problems.append(f"{at}.{role}: {dev.label} is also used by {seen_devices[key]}")
            seen_devices.setdefault(key, f"{at}.{role}")
        problems += _check_names(at, c)
        if c.filesystem is not None:
            problems += _check_filesystem(at, i, c.filesystem, seen_mounts)
    return problems


def _check_backend(at: str, c: _Parts) -> list[str]:
    """The cache device, mode and tunables the cache's backend takes."""
    if c.backend is None:
        return []
    problems: list[str] = []
    backend = BACKENDS[c.backend]
    if not backend.block_cache and "cache" in c.given:
        caches = ", ".join(n for n, b in BACKENDS.items() if b.block_cache)
        problems.append(f"{at}.cache: backend {c.backend} puts XFS straight on `origin`; "
                        f"remove `cache` or choose {caches}")
    if backend.block_cache and "cache" not in c.given:
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


def _check_names(at: str, c: _Parts) -> list[str]:
    """Names fstab and units can carry: no control character in a path or label."""
    fs = c.filesystem
    problems: list[str] = []
    for field, text in (("filesystem.mountpoint", fs.mountpoint if fs else None),
                        ("filesystem.label", fs.label if fs else None),
                        *((f"{role}.loop.file", d.loop.file) for role, d in
                          c.devices().items() if d.loop),
                        *((f"{role}.path", d.path) for role, d in c.devices().items()
                          if d.path)):
        if text is not None and _CONTROL.search(text):
            problems.append(f"{at}.{field}: {text!r} contains a control character "
                            "(newline, tab, ...); fstab, units and logs split on them. "
                            "Rename it")
    return problems


def _check_filesystem(at: str, i: int, fs: Filesystem, seen_mounts: dict[str, int]) -> list[str]:
    """The mountpoint (its own, absolute, not a system folder, not another cache's), the
    label, options, owner and mode."""
    problems: list[str] = []
    mp = os.path.normpath(fs.mountpoint)
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
    if fs.mode is not None and not re.fullmatch(OCTAL_MODE, fs.mode):
        problems.append(f"{at}.filesystem.mode: {fs.mode!r} must be octal like '0755' or "
                        "'2775' (quote it in YAML)")
    return problems


def _check_device(at: str, dev: DeviceRef) -> list[str]:
    if dev.path is not None:
        if not os.path.exists(dev.path):
            return [f"{at}: device {dev.path} does not exist (see `hotcache devices`)"]
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
    """The spec in `text`, or one SpecError with every problem found, each at its
    `source:line:col`: YAML's, the model's, and, for every cache or part of one that the
    model accepts, the host's."""
    doc = Document(text, source)
    problems = doc.duplicates() + _structural_problems(doc.data)
    spec = None if problems else HostSpec.model_validate(doc.data)
    caches = doc.data.get("caches") if isinstance(doc.data, dict) else None
    if spec is not None:
        parts: list[_Parts | None] = [_Parts.of(c) for c in spec.caches]
    else:
        parts = [_Parts.salvage(c) for c in caches] if isinstance(caches, list) else []
    for line in _semantic(parts):   # `yaml.path: what`, located by its path
        path, _, message = line.partition(": ")
        problems.append(Problem(parse_path(path), message,
                                wants_text=message.startswith("must be str")))
    if problems or spec is None:
        raise doc.error(problems)
    return spec


STDIN = "-"


def load_spec(path: str | os.PathLike[str]) -> HostSpec:
    """The spec in the file `path`, or on standard input for `-` (`<stdin>` in messages)."""
    if str(path) == STDIN:
        return parse_spec(sys.stdin.read(), "<stdin>")
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise SpecError(str(p), ["file not found"], hint="give the path of a host spec "
                        "(examples/ has some to start from), or - to read it from stdin") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise SpecError(str(p), [f"cannot read it: {exc}"]) from None
    return parse_spec(text, str(p))


def without_wipe(spec: dict[str, Any]) -> dict[str, Any]:
    """`wipe: true` was consent for the first build; a restore never replays it."""
    out = dict(spec)
    for role in ("origin", "cache"):
        if isinstance(out.get(role), dict):
            out[role] = {k: v for k, v in out[role].items() if k != "wipe"}
    return out
