"""A training job's timing figures pushed to a Prometheus Pushgateway, beside the
metrics of the node's cache.

    HOTCACHE_PUSHGATEWAY=http://pushgw:9091 python train.py     # or pushgateway=URL

Prometheus scrapes the gateway with `honor_labels: true`, so each series keeps the
labels pushed here:

    job      the Slurm job (SLURM_JOB_ID), the Kubernetes pod (POD_NAME, else the pod's
             host name), HOTCACHE_JOB when set; else NODE-PID
    rank     RANK, else SLURM_PROCID, else 0
    node     the host the job runs on, as the node's own metrics name it in `instance`
             (HOTCACHE_NODE, SLURMD_NODENAME, NODE_NAME from the downward API, else the
             host name; cut at the first dot): the dashboard and the alert join on it
    loader   the timer's name ("train", "fit")
    dataset, version, hot   of the data root the process resolved (data_root())

Grouping key: job and rank, so each rank has its own group and a finished job deletes
only its own (at exit; a job killed outright leaves it, and the group's
push_time_seconds stops moving: the alert and the dashboard only count groups pushed to
in the last 10 minutes).

The training thread only stores the latest figures and wakes a background thread,
which pushes (and repeats the last push every HEARTBEAT_S, so a live job stays fresh
between long windows). A gateway that is down or refuses never fails the job: one
WARNING names it and the reason, later failures are silent, and pushing resumes when
it answers again. Standard library only (urllib).
"""

from __future__ import annotations

import atexit
import base64
import logging
import os
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .logs import say
from .figures import Summary, data_root_now, hot_fraction

ENV_JOB = "HOTCACHE_JOB"
ENV_NODE = "HOTCACHE_NODE"
HEARTBEAT_S = 30.0
TIMEOUT_S = 5.0
CLOSE_WAIT_S = 2 * TIMEOUT_S


def node_name() -> str:
    """The short name of the host the job runs on (see the module doc)."""
    for var in (ENV_NODE, "SLURMD_NODENAME", "NODE_NAME"):
        value = os.environ.get(var, "").strip()
        if value:
            return value.split(".")[0]
    return socket.gethostname().split(".")[0]


def job_name() -> str:
    """Which job this process belongs to (see the module doc)."""
    for var in (ENV_JOB, "SLURM_JOB_ID"):
        value = os.environ.get(var, "").strip()
        if value:
            return value
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        pod = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname()
        if pod:
            return pod
    return f"{node_name()}-{os.getpid()}"


def rank() -> str:
    for var in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return value
    return "0"


def _segment(name: str, value: str) -> str:
    """One label of a Pushgateway URL path; base64 where the value has a slash or is
    empty (the gateway's `name@base64/value` form)."""
    if value and "/" not in value:
        return f"{name}/{urllib.parse.quote(value, safe='')}"
    return f"{name}@base64/{base64.urlsafe_b64encode(value.encode()).decode() or '='}"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())


def root_labels(root: Any) -> dict[str, str]:
    """dataset, version, hot of a data root (empty strings and "unknown" without one)."""
    if root is None:
        return {"dataset": "", "version": "", "hot": "unknown"}
    dataset = root.copy.name or root.path.name
    return {"dataset": str(dataset), "version": str(root.copy.version or ""), "hot": root.hot}


METRICS = (
    ("hotcache_input_wait_seconds", "The batch wait's quantiles over the last window or epoch."),
    ("hotcache_input_waiting_ratio", "Share of step time the loop waited for its batches."),
    ("hotcache_input_hot_ratio", "Share of samples read from a hot copy."),
    ("hotcache_input_step_seconds", "Mean time from one batch's arrival to the next's."),
    ("hotcache_input_step", "The global step (batch index) of the figures."),
    ("hotcache_input_epoch", "The epoch of the figures."),
)


def exposition(latest: dict[str, tuple[Summary, int, Any]], node: str) -> str:
    """The text format of the latest figures of each loader."""
    samples: dict[str, list[str]] = {name: [] for name, _ in METRICS}
    for loader, (s, step, root) in sorted(latest.items()):
        base = {"loader": loader, "node": node, **root_labels(root)}
        lab = _labels(base)
        samples["hotcache_input_wait_seconds"] += [
            f'hotcache_input_wait_seconds{{{lab},quantile="0.5"}} {s.p50_wait_s!r}',
            f'hotcache_input_wait_seconds{{{lab},quantile="0.95"}} {s.p95_wait_s!r}']
        if s.wait_share is not None:
            samples["hotcache_input_waiting_ratio"].append(
                f"hotcache_input_waiting_ratio{{{lab}}} {s.wait_share!r}")
        hot = hot_fraction(s, root)
        if hot is not None:
            samples["hotcache_input_hot_ratio"].append(f"hotcache_input_hot_ratio{{{lab}}} {hot!r}")
        samples["hotcache_input_step_seconds"].append(f"hotcache_input_step_seconds{{{lab}}} {s.step_s!r}")
        samples["hotcache_input_step"].append(f"hotcache_input_step{{{lab}}} {step}")
        samples["hotcache_input_epoch"].append(f"hotcache_input_epoch{{{lab}}} {s.epoch}")
    lines = []
    for name, help_text in METRICS:
        if samples[name]:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *samples[name]]
    return "\n".join(lines) + "\n"


class Pushgateway:
    """One job rank's group on a Pushgateway, pushed from a background thread. Called
    (as a sink) on the training thread: stores the figures and wakes the thread."""

    def __init__(self, url: str, *, job: str | None = None, rank_: str | None = None,
                 node: str | None = None, logger: logging.Logger | None = None):
        url = url if "://" in url else f"http://{url}"
        self.base = url.rstrip("/")
        self.job, self.rank, self.node = job or job_name(), rank_ or rank(), node or node_name()
        self.group = f"{self.base}/metrics/{_segment('job', self.job)}/{_segment('rank', self.rank)}"
        self.logger = logger
        self.latest: dict[str, tuple[Summary, int, Any]] = {}
        self.pushes = 0                     # answered pushes (tests, diagnostics)
        self.failures = 0
        self._warned = False
        self._wake = threading.Event()
        self._stop = False
        self._pending = False
        self._thread = threading.Thread(target=self._run, name="hotcache-pushgateway", daemon=True)
        self._thread.start()

    def __call__(self, summary: Summary, final: bool, step: int) -> None:
        # The training thread: one dict store and an Event.set, no I/O.
        self.latest[summary.name] = (summary, step, data_root_now())
        self._pending = True
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(HEARTBEAT_S)
            self._wake.clear()
            if self._stop:
                return
            if self._pending or self.latest:
                self._pending = False
                self._send("PUT", exposition(dict(self.latest), self.node))

    def _send(self, method: str, body: str | None) -> bool:
        data = body.encode() if body is not None else None
        req = urllib.request.Request(self.group, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "text/plain; version=0.0.4")
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as answer:
                answer.read()
        except (OSError, ValueError) as exc:      # URLError, HTTPError, timeouts are OSErrors
            self.failures += 1
            if not self._warned:
                self._warned = True
                reason = getattr(exc, "reason", None) or exc
                say(logging.WARNING, "pushgateway %s: %s %s failed (%s); the job goes on, its "
                    "timing figures are not published there (no further warnings)",
                    self.base, method, self.group, reason)
            return False
        self.pushes += 1
        return True

    def close(self, delete: bool = True) -> None:
        """Push what is left, then delete this rank's group (the job has finished)."""
        if self._stop:
            return
        self._stop = True
        self._wake.set()
        self._thread.join(CLOSE_WAIT_S)
        if self._pending and self.latest:
            self._send("PUT", exposition(dict(self.latest), self.node))
        if delete:
            self._send("DELETE", None)


_publishers: dict[str, Pushgateway] = {}
_lock = threading.Lock()


def publisher(url: str) -> Pushgateway:
    """This process's publisher to `url` (one group per rank, shared by its timers),
    closed (its group deleted) when the process exits."""
    with _lock:
        pub = _publishers.get(url)
        if pub is None or pub._stop:
            pub = _publishers[url] = Pushgateway(url)
            atexit.register(pub.close)
        return pub
