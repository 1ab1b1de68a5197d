"""Node labels (NFD feature file) and Kubernetes manifests from the mapping, built from
real hot-copy folders and status rows, checked with NFD's documented rules and the
OpenAPI schemas of a pinned Kubernetes release. The same checks on a mapping built on
loop devices are in tests/loop/test_kube_loop.py."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import pytest
import yaml

from hotcache.provision import mapping
from hotcache.provision.errors import UsageError
from hotcache.provision.hotcopy import format as hotcopy_format
from hotcache.provision.observe import kube, metrics, nodelabels
from tests import kubecheck
from tests.helpers import hotcache
from tests.unit.observe.test_metrics import make_copy, row, write_state

NOW = dt.datetime(2027, 1, 15, 12, 0, tzinfo=dt.timezone.utc)


@pytest.fixture
def host(tmp_path):
    mp = tmp_path / "mnt"
    make_copy(mp / "imagenet", name="imagenet")
    make_copy(mp / "coco", name="coco 2017/val", verify_ok=False)       # failed verification
    make_copy(mp / "never", name="never", verified_at=None, verify_ok=None)
    state = write_state(tmp_path / "m.yaml", {"fast": {"filesystem": {"mountpoint": str(mp)}}})
    rows = [row("fast", mp=str(mp), stats={"mode": "writethrough"})]
    return mp, state, rows


def feature_labels(rows, state) -> dict:
    text = nodelabels.feature_file(nodelabels.labels(rows, mapping.load(state)["caches"]),
                                   now=NOW)
    return kubecheck.parse_feature_file(text, NOW)


def test_feature_file_follows_nfd_rules_and_labels_only_verified_copies(host):
    mp, state, rows = host
    got = feature_labels(rows, state)
    p = nodelabels.PREFIX
    assert got == {f"{p}/cache-fast": "bcache", f"{p}/cache-fast.mode": "writethrough",
                   f"{p}/ds-imagenet_v1": "verified"}


def test_labels_follow_the_copies(host):
    mp, state, rows = host
    key = f"{nodelabels.PREFIX}/ds-imagenet_v1"
    assert key in feature_labels(rows, state)
    # the copy fails verification: gone at the next refresh
    meta = json.loads((mp / "imagenet" / hotcopy_format.METADATA).read_text())
    (mp / "imagenet" / hotcopy_format.METADATA).write_text(json.dumps({**meta, "verify_ok": False}))
    assert key not in feature_labels(rows, state)
    # verified again, then removed
    (mp / "imagenet" / hotcopy_format.METADATA).write_text(json.dumps(meta))
    assert key in feature_labels(rows, state)
    shutil.rmtree(mp / "imagenet")
    assert key not in feature_labels(rows, state)
    # a cache that is not mounted labels nothing, not even itself
    make_copy(mp / "imagenet")
    assert feature_labels([row("fast", mp=str(mp), mounted=False)], state) == {}


def test_expiry_line_drops_every_label_once_passed(host):
    mp, state, rows = host
    text = nodelabels.feature_file(nodelabels.labels(rows, mapping.load(state)["caches"]),
                                   now=NOW, expiry_seconds=600)
    assert kubecheck.expiry_of(text) == NOW + dt.timedelta(seconds=600)
    assert kubecheck.parse_feature_file(text, NOW + dt.timedelta(seconds=599))
    assert kubecheck.parse_feature_file(text, NOW + dt.timedelta(seconds=601)) == {}


def test_names_that_break_label_rules_are_made_valid_and_distinct():
    keys = {nodelabels.copy_label(n, v) for n, v in [
        ("coco 2017/val", "v1"), ("coco-2017-val", "v1"), ("a" * 90, "v1"), ("a" * 91, "v1"),
        ("x", "2027-01-15T00:00:00+00:00"), ("x", None), ("Ünïcode", "1.0")]}
    assert len(keys) == 7
    for k in keys:
        kubecheck.check_label_key(k)
    kubecheck.check_label_key(nodelabels.cache_label("my cache/" + "z" * 80) + ".mode")
    for v in ("writeback", "a b:c" * 20, "-x-"):
        kubecheck.check_label_value("k", nodelabels.value(v))


def test_write_replaces_the_file_atomically(host, tmp_path):
    mp, state, rows = host
    target = tmp_path / "features.d" / "hotcache"
    nodelabels.write(target, rows, state)
    first = target.read_text()
    shutil.rmtree(mp / "imagenet")
    nodelabels.write(target, rows, state)
    assert "ds-imagenet_v1" in first and "ds-imagenet_v1" not in target.read_text()
    # nothing but the file: the temp file (a dot file, which NFD ignores) was renamed
    assert [p.name for p in target.parent.iterdir()] == ["hotcache"]


def test_manifests_validate_and_send_the_job_where_the_label_is(host):
    mp, state, rows = host
    caches = mapping.load(state)["caches"]
    docs = kubecheck.validate_manifests(kube.to_yaml(
        kube.manifests(rows, caches, node="gpu-7", uid=1234, gid=1234)))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["StorageClass", "PersistentVolume", "PersistentVolumeClaim", "Job"]
    sc, pv, pvc, job = docs
    assert sc["provisioner"] == "kubernetes.io/no-provisioner"
    assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
    assert pv["spec"]["local"]["path"] == str(mp / "imagenet")
    assert kubecheck.required_node_terms(pv) == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-7"]}]
    assert pv["spec"]["storageClassName"] == pvc["spec"]["storageClassName"] == sc["metadata"]["name"]
    assert pvc["spec"]["selector"]["matchLabels"].items() <= pv["metadata"]["labels"].items()
    # the job's required affinity is satisfied by this node's feature file, and by no
    # node without the copy
    labels = feature_labels(rows, state)
    terms = kubecheck.required_node_terms(job)
    assert kubecheck.node_matches(labels, terms)
    assert not kubecheck.node_matches({k: v for k, v in labels.items() if "ds-" not in k}, terms)
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 1234
    (c,) = pod["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env == {"DATA_ROOT": "/data", "DATA_ROOT_EXPECT": "hot"}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/data"]["readOnly"] and mounts["/data"]["mountPropagation"] == "HostToContainer"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
    assert vols[mounts["/data"]["name"]]["persistentVolumeClaim"] == {
        "claimName": pvc["metadata"]["name"], "readOnly": True}


def test_manifests_refuse_root_and_unknown_datasets(host):
    mp, state, rows = host
    caches = mapping.load(state)["caches"]
    with pytest.raises(UsageError, match="non-root"):
        kube.manifests(rows, caches, uid=0)
    with pytest.raises(UsageError, match="no verified hot copy of dataset 'coco"):
        kube.manifests(rows, caches, dataset="coco 2017/val")
    with pytest.raises(UsageError, match="quantity"):
        kube.manifests(rows, caches, shm="lots")


def test_cli_manifests_json_is_a_list_kubectl_takes(host, tmp_path):
    mp, state, _ = host
    # through the real command: status reads the (fake) mapping, which is not mounted,
    # so nothing but the StorageClass comes out, with a note saying why
    proc = hotcache("kube", "manifests", "--json", "--state", state)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "List" and [d["kind"] for d in doc["items"]] == ["StorageClass"]
    kubecheck.validate_manifests(yaml.safe_dump(doc["items"][0]))
    assert "no verified hot copy" in proc.stderr
    bad = hotcache("kube", "manifests", "--uid", "0", "--state", state)
    assert bad.returncode == 2 and "non-root" in bad.stderr and not bad.stdout


def test_timer_refreshes_the_labels_too():
    units = metrics.timer_units("/opt/hotcache", "/t/h.prom", "1min", {}, "/etc/nfd/features.d/hotcache")
    assert ("ExecStart=/opt/hotcache status --prometheus /t/h.prom --node-labels "
            "/etc/nfd/features.d/hotcache\n") in units["hotcache-metrics.service"]
    with pytest.raises(UsageError):
        metrics.timer_units("/opt/hotcache", "/t/h.prom", "1min", {}, "/a b")


def test_job_can_mount_the_mapping_for_the_stale_check(host):
    mp, state, rows = host
    caches = mapping.load(state)["caches"]
    docs = kubecheck.validate_manifests(kube.to_yaml(kube.manifests(
        rows, caches, node="n", mapping="/etc/hotcache/mappings.yaml")))
    pod = docs[-1]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert {"name": "HOTCACHE_STATE", "value": "/etc/hotcache/mappings.yaml"} in c["env"]
    (m,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/etc/hotcache"]
    assert m["readOnly"]
    (v,) = [v for v in pod["volumes"] if v["name"] == m["name"]]
    assert v["hostPath"] == {"path": "/etc/hotcache", "type": "Directory"}


def test_cli_labels_prints_writes_and_reports(host, tmp_path):
    mp, state, _ = host
    proc = hotcache("kube", "labels", "--state", state)
    assert proc.returncode == 0, proc.stderr
    assert kubecheck.parse_feature_file(proc.stdout, dt.datetime.now(dt.timezone.utc)) == {}
    target = tmp_path / "features.d" / "hotcache"
    proc = hotcache("kube", "labels", "--state", state, "--write", target, "--json", "--expiry", "120")
    doc = json.loads(proc.stdout)
    assert doc == {"kind": "kube-labels", "format_version": 1, "labels": {},
                   "file": str(target), "expiry_seconds": 120}
    assert kubecheck.expiry_of(target.read_text()) > dt.datetime.now(dt.timezone.utc)
    bad = hotcache("kube", "labels", "--state", state, "--expiry", "5")
    assert bad.returncode == 2 and not bad.stdout


def test_status_node_labels_for_one_cache_is_refused(host, tmp_path):
    mp, state, _ = host
    target = tmp_path / "features.d" / "hotcache"
    proc = hotcache("status", "fast", "--state", state, "--node-labels", target)
    assert proc.returncode == 2 and "whole host" in proc.stderr
    assert not target.exists()


@pytest.mark.parametrize("control", sorted(kubecheck.RESTRICTED))
def test_every_object_meets_the_restricted_pod_security_profile(host, control):
    """Each control of the restricted profile, over every object `kube manifests` prints
    (schema-valid first), so a namespace with pod-security.kubernetes.io/enforce:
    restricted admits the Job."""
    mp, state, rows = host
    docs = kubecheck.validate_manifests(kube.to_yaml(
        kube.manifests(rows, mapping.load(state)["caches"], node="n")))
    assert [d["kind"] for d in docs if kubecheck.pod_spec(d)] == ["Job"]
    for doc in docs:
        assert kubecheck.restricted_violations(doc, control) == [], doc["kind"]


def test_the_pod_security_check_can_fail(host):
    """The check is not vacuous: the Job with the mapping mounted from the host breaks
    exactly the hostPath controls, and the Job stripped of each setting breaks its own."""
    mp, state, rows = host
    caches = mapping.load(state)["caches"]
    job = kube.manifests(rows, caches, node="n", mapping="/etc/hotcache/mappings.yaml")[-1]
    broken = {c for c in kubecheck.RESTRICTED if kubecheck.restricted_violations(job, c)}
    assert broken == {"HostPath Volumes", "Volume Types"}
    for strip, control in (
            (lambda pod, c: pod["securityContext"].pop("seccompProfile"), "Seccomp"),
            (lambda pod, c: pod["securityContext"].pop("runAsNonRoot"), "Running as Non-root"),
            (lambda pod, c: c["securityContext"].pop("allowPrivilegeEscalation"),
             "Privilege Escalation"),
            (lambda pod, c: c["securityContext"]["capabilities"].update(drop=["NET_RAW"]),
             "Capabilities (restricted)"),
            (lambda pod, c: pod.update(hostNetwork=True), "Host Namespaces")):
        job = kube.manifests(rows, caches, node="n")[-1]
        pod = job["spec"]["template"]["spec"]
        strip(pod, pod["containers"][0])
        assert kubecheck.restricted_violations(job, control), control


def test_job_root_filesystem_is_read_only_with_writable_scratch(host):
    mp, state, rows = host
    job = kube.manifests(rows, mapping.load(state)["caches"], node="n")[-1]
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    vols = {v["name"]: v for v in pod["volumes"]}
    writable = {m["mountPath"]: vols[m["name"]] for m in c["volumeMounts"]
                if not m.get("readOnly")}
    assert writable == {"/dev/shm": {"name": "dshm", "emptyDir": {"medium": "Memory",
                                                                   "sizeLimit": "8Gi"}},
                        "/tmp": {"name": "tmp", "emptyDir": {}}}


def test_every_object_carries_the_recommended_labels(host):
    from hotcache.provision import __version__

    mp, state, rows = host
    docs = kube.manifests(rows, mapping.load(state)["caches"], node="n")
    recommended = {"name", "instance", "version", "component", "part-of", "managed-by"}
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert {k.removeprefix("app.kubernetes.io/") for k in labels
                if k.startswith("app.kubernetes.io/")} == recommended, doc["kind"]
        for key, value in labels.items():
            kubecheck.check_label_value(key, value)
        assert labels["app.kubernetes.io/name"] == "hotcache"
        assert labels["app.kubernetes.io/version"] == __version__
    sc, pv, pvc, job = docs
    assert [d["metadata"]["labels"]["app.kubernetes.io/component"] for d in docs] == \
        ["storage-class", "hot-copy-volume", "hot-copy-claim", "training-job"]
    # a dataset version's volume, claim and job are one instance; the pods carry it too
    assert len({d["metadata"]["labels"]["app.kubernetes.io/instance"] for d in docs[1:]}) == 1
    assert job["metadata"]["labels"].items() <= \
        job["spec"]["template"]["metadata"]["labels"].items()


def published(rows, state, mp) -> tuple[dict, str, str]:
    """What this node tells the cluster and Prometheus: its labels, manifests, metrics."""
    caches = mapping.load(state)["caches"]
    manifests = kube.to_yaml(kube.manifests(rows, caches, node="gpu-7", uid=1234, gid=1234))
    from prometheus_client import generate_latest
    prom = generate_latest(metrics.registry_for(rows, state)).decode()
    return feature_labels(rows, state), manifests, prom


def test_a_forged_copy_a_user_made_is_never_published(host):
    """In a group-writable tier, anyone can make a folder with a metadata file that says
    verify_ok: it is no copy hotcache made, so it is not labelled, put in a manifest or
    counted in the metrics; the real copy still is."""
    mp, state, rows = host
    make_copy(mp / "bob" / "bert", name="bert")               # a user's forgery
    labels, manifests, prom = published(rows, state, mp)
    assert not any("bert" in k for k in labels) and "bert" not in manifests
    assert "bert" not in prom
    assert f"{nodelabels.PREFIX}/ds-imagenet_v1" in labels


def test_a_recorded_copy_replaced_by_another_folder_is_no_longer_verified(host):
    """A user who can write the tier moves the copy hotcache made aside and puts a
    folder of their own bytes, with the same name and a metadata file saying verified,
    in its place: it is not that copy (another inode), so it is published nowhere."""
    mp, state, rows = host
    (mp / "imagenet").rename(mp / ".old")
    make_copy(mp / "imagenet", name="imagenet")
    labels, manifests, prom = published(rows, state, mp)
    assert f"{nodelabels.PREFIX}/ds-imagenet_v1" not in labels
    assert str(mp / "imagenet") not in manifests
    assert f'copy="imagenet"' not in prom
