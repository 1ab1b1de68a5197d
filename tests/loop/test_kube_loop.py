"""Kubernetes and containers against a real host: a cache built by `hotcache apply` on a
loop device with XFS, real hot copies, the real CLI.

- The node labels (NFD feature file) appear when a verified copy is made, and go when it
  fails verification and when it is removed; the manifests generated from that mapping
  validate against Kubernetes' schemas and send the Job to this node.
- A container's view: `data_root()` run in a new mount namespace (`unshare --mount`) in
  which the hot copy is bind-mounted read-only at /data and the host's mount is gone, as
  Docker, Podman and kubelet set it up. It reports the copy, the filesystem and the cache
  behind it; after the host rebuilt the cache it warns that the view is stale; with /sys
  hidden it says the cache is unknown.
- The same in a real OCI container run by runc (uid 1000, read-only root, the hot copy
  bound read-only with rslave propagation), including the stale warning after a rebuild
  under the running container.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hotcache.provision.hotcopy import format as hotcopy_format
from hotcache.provision.observe import nodelabels
from tests import kubecheck
from tests.helpers import hotcache, loop_spec, write_spec
from tests.unit.hotcopy.test_copy import make_dataset

pytestmark = pytest.mark.root


def build(sandbox: Path, image: str = "hot") -> Path:
    """The cache `hot` (backend none, XFS on a loop image) mounted at sandbox/mnt/hot."""
    spec = loop_spec(sandbox, "hot", "320M").replace(f"{sandbox}/hot.img", f"{sandbox}/{image}.img")
    hotcache("apply", write_spec(sandbox / f"{image}.yaml", spec), "--yes", check=True)
    return sandbox / "mnt" / "hot"


def labels_now(sandbox: Path) -> dict[str, str]:
    target = sandbox / "features.d" / "hotcache"
    proc = hotcache("status", "--prometheus", sandbox / "hotcache.prom", "--node-labels", target)
    assert proc.returncode == 0, proc.stderr
    return kubecheck.parse_feature_file(target.read_text(), dt.datetime.now(dt.timezone.utc))


def test_labels_and_manifests_follow_real_hot_copies(sandbox):
    mp = build(sandbox)
    key = f"{nodelabels.PREFIX}/ds-toy_3"
    assert labels_now(sandbox) == {f"{nodelabels.PREFIX}/cache-hot": "none",
                                   f"{nodelabels.PREFIX}/cache-hot.mode": "none"}
    src = make_dataset(sandbox / "src")
    hotcache("copy", src, mp / "toy", "--name", "toy", "--version", "3", "--verify", check=True)
    assert labels_now(sandbox)[key] == "verified"

    proc = hotcache("kube", "manifests", "--node", "gpu-node-1", "--uid", "1500")
    assert proc.returncode == 0, proc.stderr
    docs = kubecheck.validate_manifests(proc.stdout)
    (pv,) = [d for d in docs if d["kind"] == "PersistentVolume"]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    assert pv["spec"]["local"]["path"] == str(mp / "toy")
    assert kubecheck.required_node_terms(pv) == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-node-1"]}]
    assert kubecheck.node_matches(labels_now(sandbox), kubecheck.required_node_terms(job))

    # a file goes bad: verify fails (exit 5) and the label is gone at the next refresh
    victim = next((mp / "toy" / "cat").iterdir())
    victim.write_bytes(b"rotten" + victim.read_bytes()[6:])
    assert hotcache("verify", mp / "toy", "--full").returncode == 5
    assert key not in labels_now(sandbox)
    assert not kubecheck.node_matches(labels_now(sandbox), kubecheck.required_node_terms(job))
    # copied again and verified: back; removed: gone
    hotcache("copy", src, mp / "toy", "--name", "toy", "--version", "3", "--checksum",
             "--verify", check=True)
    assert labels_now(sandbox)[key] == "verified"
    shutil.rmtree(mp / "toy")
    assert key not in labels_now(sandbox)
    # the cache is taken down: no label at all
    hotcache("teardown", "hot", "--yes", check=True)
    assert labels_now(sandbox) == {}


CONTAINER = """
set -e
mount --bind -o ro "$HOT_COPY" /data
umount -l "$HOST_MOUNT"
step() { "$PY" -m hotcache.adapters; echo "--- $?"; read next; }
step
step
mount -t tmpfs none /sys
step
"""


def steps(proc: subprocess.Popen):
    """Each step's output lines, then tell the namespace to go on."""
    while True:
        lines = []
        for line in proc.stdout:
            if line.startswith("--- "):
                break
            lines.append(line.rstrip("\n"))
        else:
            return
        yield lines, int(line.split()[1])
        proc.stdin.write("\n")
        proc.stdin.flush()


@pytest.fixture
def slash_data():
    made = not os.path.exists("/data")
    if made:
        os.mkdir("/data")
    yield Path("/data")
    if made:
        os.rmdir("/data")


def test_container_view_of_a_bind_mounted_hot_copy(sandbox, slash_data):
    mp = build(sandbox)
    src = make_dataset(sandbox / "src")
    hotcache("copy", src, mp / "toy", "--name", "toy", "--version", "3", "--verify", check=True)
    env = {**os.environ, "HOT_COPY": str(mp / "toy"), "HOST_MOUNT": str(mp), "PY": sys.executable,
           "DATA_ROOT": "/data", "DATA_ROOT_EXPECT": "hot", "HOTCACHE_LOG": "json"}
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             CONTAINER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        it = steps(proc)
        lines, rc = next(it)
        assert rc == 0, lines
        seen = json.loads(lines[0])
        assert seen["hot"] is True and seen["copy"]["name"] == "toy"
        assert seen["copy"]["version"] == "3" and seen["copy"]["verified_at"]
        assert seen["path"] == "/data" and seen["mountpoint"] == "/data"
        assert seen["mount_root"] == "/toy"                   # a bind of a folder, not of /
        assert seen["fs"] == "xfs" and seen["device"].startswith("loop")
        assert seen["cache"] == "none" and seen["device_detail"].startswith("loop on ")
        assert seen["view"] == "fresh" and seen["mapped_cache"] == "hot"
        assert len(lines) == 1                                # no warning

        # the host rebuilds the cache: teardown, then a new filesystem on a new image at
        # the same mountpoint, while the container still holds the old one
        hotcache("teardown", "hot", "--yes", check=True)
        build(sandbox, image="hot-rebuilt")
        lines, rc = next(it)
        seen = json.loads(lines[0])
        assert seen["hot"] is True                            # the old copy is still readable
        assert seen["view"] == "stale" and seen["mapped_cache"] == "hot"
        assert any(x.startswith("data_root STALE:") and "rebuilt" in x for x in lines[1:]), lines

        # /sys hidden: the cache behind the data cannot be told, and is not guessed
        lines, rc = next(it)
        seen = json.loads(lines[0])
        assert seen["cache"] == "unknown" and "not visible" in seen["device_detail"]
        assert next(it, None) is None
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait()
    assert hotcache_format_ok(mp)


def hotcache_format_ok(mp: Path) -> bool:
    """The rebuilt cache on the host is an empty, healthy filesystem of its own."""
    return not (mp / "toy" / hotcopy_format.METADATA).exists() and os.path.ismount(mp)


def runc_bundle(root: Path, hot_copy: Path, state_dir: Path) -> Path:
    """An OCI bundle for runc: an empty read-only rootfs with the host's system folders
    (and this checkout's venv) bound read-only, the hot copy bind-mounted read-only at
    /data with rslave propagation, the mapping's folder at /hotcache, uid 1000. The cgroup
    mount and rlimits of `runc spec` are left out: this machine's cgroup v1 cannot be
    mounted in a container, and the rest of the container is what matters here."""
    bundle = root / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    config = json.loads((bundle / "config.json").read_text())
    venv = Path(sys.executable).parent.parent
    # the interpreter, this checkout and every folder on sys.path (the venv may see a
    # shared venv's packages through a .pth file)
    system = ["/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc",
              str(Path(os.path.realpath(sys.executable)).parents[2]), str(REPO)]
    system += sorted({p for p in map(os.path.realpath, sys.path) if os.path.isdir(p)
                      and not any(p.startswith(s.rstrip("/") + "/") for s in system)})
    mounts = [m for m in config["mounts"] if m["type"] != "cgroup"]
    mounts += [{"destination": d, "type": "bind", "source": d,
                "options": ["rbind", "ro", "rprivate"]} for d in system if os.path.isdir(d)]
    mounts += [{"destination": "/data", "type": "bind", "source": str(hot_copy),
                "options": ["rbind", "ro", "rslave"]},
               {"destination": "/hotcache", "type": "bind", "source": str(state_dir),
                "options": ["rbind", "ro", "rprivate"]}]
    for m in mounts:
        (bundle / "rootfs" / m["destination"].lstrip("/")).mkdir(parents=True, exist_ok=True)
    config["mounts"] = mounts
    config["root"] = {"path": "rootfs", "readonly": True}
    config["process"].update(
        terminal=False, user={"uid": 1000, "gid": 1000},
        args=[str(venv / "bin" / "python"), "-m", "hotcache.adapters"],
        env=["PATH=/usr/bin:/bin", "DATA_ROOT=/data", "DATA_ROOT_EXPECT=hot",
             "HOTCACHE_LOG=json", "HOTCACHE_STATE=/hotcache/mappings.yaml"])
    config["process"].pop("rlimits", None)
    config["linux"].pop("resources", None)
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


REPO = Path(__file__).resolve().parents[2]


def test_real_container_runc(sandbox):
    """The same view from a real OCI container (runc): a read-only root, its own mount,
    PID, IPC, UTS and network namespaces, uid 1000, the hot copy bound read-only; and the
    stale warning after the host rebuilt the cache under the running container."""
    mp = build(sandbox)
    src = make_dataset(sandbox / "src")
    hotcache("copy", src, mp / "toy", "--name", "toy", "--version", "3", "--verify", check=True)
    bundle = runc_bundle(sandbox, mp / "toy", sandbox / "state")
    config = json.loads((bundle / "config.json").read_text())
    check = config["process"]["args"]
    config["process"]["args"] = ["/bin/sleep", "600"]
    (bundle / "config.json").write_text(json.dumps(config))
    name = f"hotcache-test-{os.getpid()}"

    def data_root_in_container() -> tuple[dict, list[str]]:
        proc = subprocess.run(["runc", "exec", name, *check], capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        return json.loads(lines[0]), lines[1:]

    try:
        subprocess.run(["runc", "run", "--detach", name], cwd=bundle, check=True, timeout=120,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        seen, more = data_root_in_container()
        assert seen["hot"] is True and seen["copy"]["name"] == "toy" and seen["copy"]["version"] == "3"
        assert seen["mount_root"] == "/toy" and seen["fs"] == "xfs"
        assert seen["cache"] == "none" and seen["device"].startswith("loop")
        assert seen["view"] == "fresh" and seen["mapped_cache"] == "hot" and more == []
        hotcache("teardown", "hot", "--yes", check=True)
        build(sandbox, image="hot-rebuilt")
        seen, more = data_root_in_container()
        assert seen["view"] == "stale"
        assert any(x.startswith("data_root STALE:") for x in more), more
    finally:
        subprocess.run(["runc", "delete", "--force", name], capture_output=True)


def test_the_metrics_refresh_sweeps_stale_progress_files(sandbox):
    """`status --prometheus FILE` (the metrics timer) removes day-old progress files of
    copies and warm-ups from FILE's folder and keeps a current one."""
    build(sandbox)
    stale = sandbox / "hotcache-progress-copy-0123456789ab.prom"
    current = sandbox / "hotcache-progress-warm-ba9876543210.prom"
    for f in (stale, current):
        f.write_text("hotcache_progress_running 0\n")
    os.utime(stale, (1, 1))
    labels_now(sandbox)
    assert not stale.exists() and current.exists()
