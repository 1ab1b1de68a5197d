"""A one-node Slurm cluster on this host for the test: munged, slurmctld and slurmd from
Debian's `munge` and `slurm-wlm` (.ci/install puts them there), every file of theirs in
a temporary folder, on free ports, with their own munge key and socket. The daemons are
stopped and the folder removed afterwards, also when the test failed."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.accounts import account, open_sandbox, opt_venv  # noqa: F401  (fixtures)
from tests.loop.conftest import sandbox  # noqa: F401  (the loop tier's fixture)

SBIN = ("munged", "slurmctld", "slurmd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, probe, limit: float = 90.0):
    """Poll `probe` until it returns something true; fail naming `what` at the limit."""
    deadline = time.monotonic() + limit
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.3)


class Cluster:
    """`hotcache` is the program the helper scripts run: by default this venv's, through
    its interpreter (root's jobs only); an installed one (/opt/.../bin/hotcache) as the
    Ansible role writes the scripts, for ordinary accounts' jobs."""

    def __init__(self, root: Path, state: Path, helpers: list[str],
                 hotcache: str | None = None):
        self.root, self.node = root, socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for d in ("munge", "spool", "state", "log", "jobs"):
            (root / d).mkdir(mode=0o700)
        os.chmod(root, 0o755)
        os.chmod(root / "munge", 0o755)     # every account's sbatch asks munged
        os.chmod(root / "jobs", 0o1777)     # job scripts and output of any account
        hotcache = hotcache or f"{sys.executable} -m hotcache.provision"
        env = f"HOTCACHE_STATE={state} HOTCACHE_FSTAB={state.parent.parent / 'fstab'}"
        self.hotcache_env = {"HOTCACHE_STATE": str(state), "SLURM_CONF": str(self.conf)}
        self.feature_helper = self._script("features.sh", f"exec env {env} {hotcache} slurm features")
        self.task_prolog = self._script("task-prolog.sh", f"exec env {env} {hotcache} slurm task-prolog")
        self.helpers = helpers

    def _script(self, name: str, line: str) -> Path:
        """As the Ansible role writes them (playbooks/roles/hotcache/tasks/slurm.yml)."""
        path = self.root / name
        path.write_text(f"#!/bin/sh\n# Installed by hotcache's Ansible role (docs/slurm.md).\n{line}\n")
        path.chmod(0o755)
        return path

    def write_conf(self, helper_lines: str | None = None) -> None:
        """slurm.conf, with the node_features/helpers plugin when helper_lines are given
        (helpers.conf), else none: features come from `hotcache slurm push`."""
        r = self.root
        plugin = ""
        if helper_lines is not None:
            (r / "helpers.conf").write_text(helper_lines)
            plugin = "NodeFeaturesPlugins=node_features/helpers\n"
        self.conf.write_text(f"""\
ClusterName=hctest
SlurmctldHost={self.node}(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/sock
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
{plugin}TaskProlog={self.task_prolog}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=hc Nodes=ALL Default=YES MaxTime=5 State=UP
""")

    def start(self) -> None:
        r = self.root
        key = r / "munge" / "key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        subprocess.run(["munged", f"--socket={r}/munge/sock", f"--key-file={key}",
                        f"--pid-file={r}/munge/pid", f"--log-file={r}/munge/log",
                        f"--seed-file={r}/munge/seed", "--force"], check=True)
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True, env=self.env)
        self.start_slurmd()

    def start_slurmd(self) -> None:
        subprocess.run(["slurmd", "-f", str(self.conf)], check=True, env=self.env)
        wait_for("the node to be idle", lambda: "State=IDLE" in self.show_node())

    def stop_slurmd(self) -> None:
        self._stop(self.root / "slurmd.pid")

    def _stop(self, pidfile: Path) -> None:
        try:
            pid = int(pidfile.read_text())
        except (OSError, ValueError):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        wait_for(f"pid {pid} to exit", lambda: not _alive(pid), 60)

    def stop(self) -> None:
        for pidfile in ("slurmd.pid", "slurmctld.pid", "munge/pid"):
            self._stop(self.root / pidfile)

    def scontrol(self, *args: str) -> str:
        return subprocess.run(["scontrol", *args], env=self.env, capture_output=True,
                              text=True, check=True).stdout

    def show_node(self) -> str:
        proc = subprocess.run(["scontrol", "show", "node", "-o", self.node], env=self.env,
                              capture_output=True, text=True)
        return proc.stdout if proc.returncode == 0 else ""

    def sbatch(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sbatch", "--parsable", *args], env=self.env,
                              capture_output=True, text=True, cwd=self.root / "jobs")

    def sbatch_as(self, user, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        """sbatch run by `user` (an ordinary account), from the shared jobs folder."""
        from tests.accounts import run_as

        return run_as(user, ["sbatch", "--parsable", *args],
                      {"SLURM_CONF": str(self.conf), **(env or {})}, cwd=self.root / "jobs")

    def finished(self, job_id: str) -> str:
        """Wait for the job to end; its state (COMPLETED, FAILED, ...)."""
        def ended():
            for word in self.job(job_id).split():
                key, _, val = word.partition("=")
                if key == "JobState" and val not in ("PENDING", "RUNNING", "CONFIGURING",
                                                     "COMPLETING"):
                    return val
            return None
        return wait_for(f"job {job_id} to end", ended)

    def job(self, job_id: str) -> str:
        return subprocess.run(["scontrol", "show", "job", "-o", job_id], env=self.env,
                              capture_output=True, text=True).stdout


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def _cluster(root: Path, state: Path, hotcache: str | None = None):
    """A Cluster in `root`, its daemons stopped and `root` removed afterwards."""
    missing = [p for p in SBIN if shutil.which(p) is None]
    assert not missing, f"{missing} not installed: run .ci/install (Debian's slurm-wlm, munge)"
    made = Cluster(root, state, [], hotcache=hotcache)
    try:
        yield made
    finally:
        try:
            made.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def user_cluster(open_sandbox, opt_venv):  # noqa: F811
    """A cluster whose helper scripts run hotcache installed in a root-owned venv on the
    system Python, in folders every account can reach."""
    yield from _cluster(Path(tempfile.mkdtemp(prefix="hotcache-slurm-", dir="/tmp")),
                        open_sandbox / "state" / "mappings.yaml", str(opt_venv / "hotcache"))


@pytest.fixture
def cluster(sandbox, tmp_path_factory):  # noqa: F811
    yield from _cluster(Path(tmp_path_factory.mktemp("slurm")),
                        sandbox / "state" / "mappings.yaml")
