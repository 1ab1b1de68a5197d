"""CLI commands for Kubernetes: `hotcache kube labels` and `hotcache kube manifests`.
Registered on the app by cli/app.py; the work is in observe/nodelabels.py and
observe/kube.py, imported inside each command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from hotcache.provision.cli.common import FstabOpt, JsonOpt, StateOpt, emit
from hotcache.provision.system.runner import Runner
from hotcache.provision.system.statepath import state_path

if TYPE_CHECKING:
    from hotcache.provision.engine.statusrow import StatusRow
    from hotcache.provision.records import CacheEntry

kube_app = typer.Typer(
    help="Send training jobs to the nodes that hold their hot data.\n\n"
         "`hotcache kube labels` writes the node-feature-discovery feature file that labels "
         "this node with its caches and verified hot copies (the metrics timer refreshes it "
         "with `metrics-timer --node-labels FILE`); `hotcache kube manifests | kubectl "
         "apply -f -` creates local PersistentVolumes for those copies and an example Job "
         "that can only land where its dataset is hot.",
    no_args_is_help=True, rich_markup_mode=None)


def _host(state: Optional[Path],
          fstab: Optional[Path]) -> tuple[list[StatusRow], dict[str, CacheEntry], Path]:
    # start-up: the host probe and the mapping's pydantic models, for these commands only
    from hotcache.provision.engine.status import host_status
    from hotcache.provision.mapping import load

    path = state_path(state and str(state))
    return host_status(path, fstab, Runner(), None), load(path)["caches"], path


def labels(
    write: Optional[Path] = typer.Option(
        None, "--write", metavar="FILE",
        help="Write the feature file to FILE atomically instead of printing it, e.g. "
             "/etc/kubernetes/node-feature-discovery/features.d/hotcache."),
    expiry: int = typer.Option(600, "--expiry", min=60, metavar="SECONDS",
                               help="nfd-worker ignores the file this long after it "
                                    "was written unless it is refreshed."),
    as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
    fstab: Optional[Path] = FstabOpt,
) -> None:
    """The node labels for this host, as a node-feature-discovery local feature file:
    `ds-<dataset>_<version>=verified` for each verified hot copy and
    `cache-<name>=<backend>` (plus `.mode`) for each cache that is up, under
    hotcache.feature.node.kubernetes.io/. A copy that fails verification or is
    removed is left out, so its label goes at the next refresh."""
    from hotcache.provision.observe import nodelabels   # start-up: this command only

    rows, caches, _ = _host(state, fstab)
    found = nodelabels.labels(rows, caches)
    text = nodelabels.feature_file(found, expiry_seconds=expiry)
    if write is not None:
        from hotcache.provision.system.atomic import write_atomic   # start-up: with --write only

        write_atomic(write, text)
    if as_json:
        return emit({"labels": found, "file": str(write) if write else None,
                     "expiry_seconds": expiry}, "kube-labels")
    if write is None:
        sys.stdout.write(text)
    else:
        sys.stdout.write(f"wrote {len(found)} label(s) to {write}\n")

def manifests(
    dataset: Optional[str] = typer.Option(None, "--dataset",
                                          help="Only this dataset [default: every "
                                               "verified hot copy]."),
    node: Optional[str] = typer.Option(None, "--node", help="Kubernetes node name "
                                       "[default: the host name in lower case]."),
    namespace: str = typer.Option("default", "--namespace", "-n",
                                  help="Namespace of the claims and Jobs."),
    image: str = typer.Option("hotcache-train:latest", "--image",
                              help="Training image (see examples/Dockerfile)."),
    uid: int = typer.Option(1000, "--uid", help="User id the job runs as (not 0)."),
    gid: int = typer.Option(1000, "--gid", help="Group id the job runs as."),
    shm: str = typer.Option("8Gi", "--shm-size",
                            help="Shared memory for DataLoader workers (an in-memory "
                                 "emptyDir at /dev/shm)."),
    storage_class: str = typer.Option("hotcache-local", "--storage-class",
                                      help="Name of the StorageClass."),
    mount_mapping: bool = typer.Option(
        False, "--mount-mapping", help="Mount the mapping's folder read-only into the "
        "Job (a hostPath volume) so that data_root() can warn when the host rebuilt the "
        "cache under a running pod. A namespace that enforces the restricted Pod Security "
        "profile refuses hostPath volumes."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON `List` object "
                                 "(kubectl takes it too) instead of YAML."),
    state: Optional[Path] = StateOpt, fstab: Optional[Path] = FstabOpt,
) -> None:
    """Print Kubernetes objects for this host's verified hot copies, for `kubectl apply
    -f -`: a StorageClass (no provisioner, WaitForFirstConsumer), one local
    PersistentVolume per copy bound to this node, and per dataset version a claim and
    an example Job that requires the copy's node label, mounts it read-only at /data
    and sets DATA_ROOT=/data DATA_ROOT_EXPECT=hot. The Job's pod logs the data_root
    line (`hot=yes ...`); put the training command in its place."""
    from hotcache.provision.observe import kube   # start-up: this command only (and YAML)

    rows, caches, path = _host(state, fstab)
    docs = kube.manifests(rows, caches, node=node, dataset=dataset, namespace=namespace,
                          image=image, uid=uid, gid=gid, shm=shm, sc=storage_class,
                          mapping=str(path.absolute()) if mount_mapping else None)
    if len(docs) == 1:
        sys.stderr.write(f"note: no verified hot copy on a mounted cache of {path}; only "
                         "the StorageClass was printed. `hotcache copy SRC DEST --verify` "
                         "makes one\n")
    if as_json:
        return emit({"apiVersion": "v1", "kind": "List", "items": docs}, None)
    sys.stdout.write(kube.to_yaml(docs))


def register(app: typer.Typer) -> None:
    kube_app.command("labels")(labels)
    kube_app.command("manifests")(manifests)
    app.add_typer(kube_app, name="kube")
