"""Kubernetes manifests from the mapping: the verified hot copies of this node as local
PersistentVolumes, and a training Job that can only land where its dataset is hot.

What `hotcache kube manifests` prints (YAML documents that `kubectl apply -f -` takes):
- a StorageClass with `kubernetes.io/no-provisioner` and `WaitForFirstConsumer`, so a
  claim binds only once its pod is scheduled, to a volume on that pod's node;
- one local PersistentVolume per verified hot copy, with a *required* nodeAffinity to
  this node (`kubernetes.io/hostname`), labelled with the dataset and version;
- per dataset version, a PersistentVolumeClaim selecting those labels and an example Job
  that requires the node label `hotcache kube labels` publishes for that copy (required,
  not preferred: a preferred affinity is dropped silently under pressure), mounts the
  claim read-only at /data with HostToContainer (rslave) propagation, sets DATA_ROOT and
  DATA_ROOT_EXPECT=hot so the job refuses to read anything but the hot copy, and gives
  DataLoader workers shared memory (an emptyDir in memory).

The Job meets the Pod Security "restricted" profile, so it runs in a namespace that
enforces it: a non-root uid, no privilege escalation, every capability dropped, the
runtime's default seccomp profile, and a read-only root filesystem, with in-memory or
node-disk emptyDirs where a training process writes (/dev/shm for DataLoader workers,
/tmp). `--mount-mapping` adds a hostPath volume, which that profile refuses (it says so).
Every object carries the recommended app.kubernetes.io/* labels.

The node name defaults to the host name in lower case, which is what kubelet registers
unless it was started with --hostname-override.
"""

from __future__ import annotations

import math
import re
import socket
from typing import TYPE_CHECKING, Any
from pathlib import PurePosixPath

import yaml

from hotcache.provision import __version__
from hotcache.provision.errors import UsageError
from hotcache.provision.observe import nodelabels

if TYPE_CHECKING:
    from hotcache.provision.engine.statusrow import StatusRow
    from hotcache.provision.observe.nodelabels import UpCopy
    from hotcache.provision.records import CacheEntry

MANAGED_BY = {"app.kubernetes.io/managed-by": "hotcache"}
PART_OF = "hotcache"
DATASET_KEY = "hotcache.io/dataset"
VERSION_KEY = "hotcache.io/version"
HOSTNAME_KEY = "kubernetes.io/hostname"
DATA_MOUNT = "/data"
DEFAULT_IMAGE = "hotcache-train:latest"
DEFAULT_STORAGE_CLASS = "hotcache-local"
SMOKE_COMMAND = ["python", "-m", "hotcache.adapters"]


def default_node() -> str:
    return socket.gethostname().lower()


def dns_name(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 name (lower case, digits, `-`) from `parts`; hashed when cut short."""
    raw = "-".join(str(p) for p in parts)
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    if len(name) > limit or name != raw.lower():
        tail = nodelabels.slug(raw, limit=9)[-8:].lower()
        name = f"{name[: limit - 9].strip('-')}-{tail}"
    return name


def quantity(nbytes: float | None) -> str:
    """A storage quantity for `nbytes`, rounded up to MiB (at least 1Mi)."""
    return f"{max(1, math.ceil((nbytes or 0) / (1 << 20)))}Mi"


def app_labels(component: str, instance: str) -> dict[str, str]:
    """Kubernetes' recommended labels: which application (hotcache, its version) made
    the object, what part of it the object is, and which instance (a storage class, a
    dataset version) it belongs to."""
    return {"app.kubernetes.io/name": "hotcache", "app.kubernetes.io/instance": instance,
            "app.kubernetes.io/version": nodelabels.value(__version__) or "unknown",
            "app.kubernetes.io/component": component, "app.kubernetes.io/part-of": PART_OF,
            **MANAGED_BY}


def _instance(copy: UpCopy) -> str:
    return dns_name(copy["name"], str(copy["version"]))


def storage_class(name: str) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name, "labels": app_labels("storage-class", name)},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Retain"}


def _selector(copy: UpCopy) -> dict[str, str]:
    return {DATASET_KEY: nodelabels.value(copy["name"]) or "none",
            VERSION_KEY: nodelabels.value(str(copy["version"])) or "none"}


def volume(copy: UpCopy, node: str, sc: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": dns_name("hotcache", node, copy["name"], str(copy["version"])),
                     "labels": {**app_labels("hot-copy-volume", _instance(copy)),
                                **_selector(copy),
                                "hotcache.io/cache": nodelabels.value(copy["cache"])},
                     "annotations": {"hotcache.io/path": copy["path"],
                                     "hotcache.io/node-label":
                                         nodelabels.copy_label(copy["name"], copy["version"])}},
        "spec": {
            "capacity": {"storage": quantity(copy["bytes"])},
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": sc,
            "local": {"path": copy["path"]},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": HOSTNAME_KEY, "operator": "In", "values": [node]}]}]}},
        },
    }


def claim(copy: UpCopy, namespace: str, sc: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": _instance(copy), "namespace": namespace,
                     "labels": app_labels("hot-copy-claim", _instance(copy))},
        "spec": {"storageClassName": sc, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": quantity(copy["bytes"])}},
                 "selector": {"matchLabels": _selector(copy)}},
    }


def job(copy: UpCopy, namespace: str, image: str, uid: int, gid: int, shm: str,
        mapping: str | None = None) -> dict[str, Any]:
    """The example Job. With `mapping` (the host's mapping file), its folder is mounted
    read-only from the host so that data_root() can tell a stale view (view=fresh/stale
    instead of unknown); that takes a hostPath volume, which the restricted Pod Security
    profile refuses, hence optional."""
    label = nodelabels.copy_label(copy["name"], copy["version"])
    labels = app_labels("training-job", _instance(copy))
    spec: dict[str, Any] = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": dns_name("train", copy["name"], str(copy["version"])),
                     "namespace": namespace, "labels": labels},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {**labels, DATASET_KEY: _selector(copy)[DATASET_KEY]}},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": label, "operator": "In", "values": [nodelabels.VERIFIED]}]}]}}},
                "containers": [{
                    "name": "train", "image": image,
                    # Replace with the training command; this one logs the data_root line
                    # (hot=yes ...) and fails unless /data is a verified hot copy.
                    "command": list(SMOKE_COMMAND),
                    "env": [{"name": "DATA_ROOT", "value": DATA_MOUNT},
                            {"name": "DATA_ROOT_EXPECT", "value": "hot"}],
                    "securityContext": {"allowPrivilegeEscalation": False,
                                        "capabilities": {"drop": ["ALL"]},
                                        "readOnlyRootFilesystem": True},
                    # The root filesystem is read-only: what a training process writes
                    # goes to emptyDirs (DataLoader workers' tensors to /dev/shm).
                    "volumeMounts": [
                        {"name": "data", "mountPath": DATA_MOUNT, "readOnly": True,
                         "mountPropagation": "HostToContainer"},
                        {"name": "dshm", "mountPath": "/dev/shm"},
                        {"name": "tmp", "mountPath": "/tmp"}],
                }],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {
                        "claimName": _instance(copy), "readOnly": True}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
                    {"name": "tmp", "emptyDir": {}}],
            }}},
    }
    if mapping:
        pod = spec["spec"]["template"]["spec"]
        folder = str(PurePosixPath(mapping).parent)
        pod["volumes"].append({"name": "hotcache-mapping",
                               "hostPath": {"path": folder, "type": "Directory"}})
        pod["containers"][0]["volumeMounts"].append(
            {"name": "hotcache-mapping", "mountPath": folder, "readOnly": True})
        pod["containers"][0]["env"].append({"name": "HOTCACHE_STATE", "value": mapping})
    return spec


def manifests(rows: list[StatusRow], caches: dict[str, CacheEntry], *, node: str | None = None,
              dataset: str | None = None, namespace: str = "default",
              image: str = DEFAULT_IMAGE, uid: int = 1000, gid: int = 1000,
              shm: str = "8Gi", sc: str = DEFAULT_STORAGE_CLASS,
              mapping: str | None = None) -> list[dict[str, Any]]:
    """Every object, in the order kubectl should create them."""
    if uid <= 0 or gid < 0:
        raise UsageError(f"--uid {uid} / --gid {gid}: the job must run as a non-root user",
                         hint="give the training user's uid (>0) and gid, e.g. --uid 1000")
    if not re.fullmatch(r"\d+(\.\d+)?(Ki|Mi|Gi|Ti|k|M|G|T)?", shm):
        raise UsageError(f"--shm-size {shm!r} is not a Kubernetes quantity",
                         hint="write it like 8Gi or 512Mi")
    node = node or default_node()
    copies = nodelabels.verified_copies(rows, caches)
    if dataset is not None:
        copies = [c for c in copies if c["name"] == dataset]
        if not copies:
            raise UsageError(f"no verified hot copy of dataset {dataset!r} on this host",
                             hint="`hotcache copies` lists them; `hotcache verify DEST` "
                                  "verifies one")
    docs = [storage_class(sc)]
    docs += [volume(c, node, sc) for c in copies]
    versions: dict[tuple[str, str], UpCopy] = {}
    for c in copies:
        versions.setdefault((c["name"], str(c["version"])), c)
    for c in versions.values():
        docs += [claim(c, namespace, sc), job(c, namespace, image, uid, gid, shm, mapping)]
    return docs


def to_yaml(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False,
                              explicit_start=True)
