"""A training job's input wait in Prometheus: a real Pushgateway and a real Prometheus
(Debian's prometheus-pushgateway and prometheus) on loopback, Prometheus scraping the
gateway with honor_labels as the docs say; a training loop in its own process pushes
with HOTCACHE_PUSHGATEWAY set, and Prometheus's HTTP API returns its series with the
job's labels; at the job's exit its group leaves the gateway. With the gateway stopped
the same loop finishes, with exactly one warning."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.unit.adapters.helpers import make_jpegs, write_hot_copy

pytestmark = pytest.mark.root

LOOP = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from hotcache.adapters import data_root, timed

    data_root()                                   # DATA_ROOT: the hot copy
    for epoch in range(2):
        for batch in timed(range(40), name="train", log_every=10):
            time.sleep(0.002)                     # the step
    go = Path(sys.argv[1])
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:   # until the test has looked
        time.sleep(0.1)
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read()


def wait_for(what: str, check, seconds: float = 90):
    """Poll `check()` until it returns something true; fail naming `what`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.25)


class Server:
    """A program listening on loopback, stopped (and waited for) at the end."""

    def __init__(self, argv: list[str], log: Path, url: str):
        self.url = url
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT)
        wait_for(f"{argv[0]} at {url} ({log})", lambda: self.proc.poll() is None and get(f"{url}/-/ready"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def gateway(tmp_path):
    port = free_port()
    server = Server(["prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{port}"],
                    tmp_path / "pushgateway.log", f"http://127.0.0.1:{port}")
    yield server
    server.stop()


@pytest.fixture
def prometheus(tmp_path, gateway):
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(textwrap.dedent(f"""
        global: {{scrape_interval: 1s, evaluation_interval: 1s}}
        scrape_configs:
          - job_name: pushgateway
            honor_labels: true
            static_configs: [{{targets: ["{gateway.url.split('//')[1]}"]}}]
    """))
    server = Server(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                     f"--web.listen-address=127.0.0.1:{port}"],
                    tmp_path / "prometheus.log", f"http://127.0.0.1:{port}")
    yield server
    server.stop()


@pytest.fixture
def job_env(tmp_path):
    make_jpegs(tmp_path / "src", per_class=1)
    write_hot_copy(tmp_path / "src", tmp_path / "hot", name="imagenet", version="3")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HOTCACHE_", "RANK"))}
    return {**env, "DATA_ROOT": str(tmp_path / "hot"), "SLURM_JOB_ID": "4242", "RANK": "1",
            "HOTCACHE_NODE": "gpu07.example.org", "HOTCACHE_LOG": "text"}


def query(prometheus: Server, promql: str) -> list[dict]:
    answer = json.loads(get(f"{prometheus.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def run_loop(tmp_path: Path, env: dict, go: Path) -> subprocess.Popen:
    script = tmp_path / "train.py"
    script.write_text(LOOP)
    return subprocess.Popen([sys.executable, str(script), str(go)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_jobs_series_reach_prometheus_with_its_labels_and_leave_the_gateway_at_exit(
        tmp_path, gateway, prometheus, job_env):
    go = tmp_path / "go"
    loop = run_loop(tmp_path, {**job_env, "HOTCACHE_PUSHGATEWAY": gateway.url}, go)
    try:
        series = wait_for("the job's series in Prometheus", lambda: query(
            prometheus, 'hotcache_input_waiting_ratio{job="4242"}'))
        labels = series[0]["metric"]
        assert {k: labels.get(k) for k in ("job", "rank", "node", "loader", "dataset", "version", "hot")} == {
            "job": "4242", "rank": "1", "node": "gpu07", "loader": "train", "dataset": "imagenet",
            "version": "3", "hot": "yes"}
        assert 0 <= float(series[0]["value"][1]) <= 1
        quantiles = {r["metric"]["quantile"] for r in query(prometheus, 'hotcache_input_wait_seconds{job="4242",rank="1"}')}
        assert quantiles == {"0.5", "0.95"}
        assert query(prometheus, 'hotcache_input_hot_ratio{job="4242"} == 1')
        # the freshness the alert and the dashboard rely on
        assert query(prometheus, 'time() - push_time_seconds{job="4242",rank="1"} < 600')
    finally:
        go.touch()
        out, err = loop.communicate(timeout=120)
    assert loop.returncode == 0, err
    assert "WARNING" not in err
    # The finished job deleted its group.
    assert b'job="4242"' not in get(f"{gateway.url}/metrics")


def test_a_stopped_gateway_never_fails_the_job_and_warns_once(tmp_path, gateway, job_env):
    url = gateway.url
    gateway.stop()
    go = tmp_path / "go"
    go.touch()
    loop = run_loop(tmp_path, {**job_env, "HOTCACHE_PUSHGATEWAY": url}, go)
    out, err = loop.communicate(timeout=300)
    assert loop.returncode == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "pushgateway" in warnings[0] and url in warnings[0], err
    assert err.count("timing train epoch=") == 2          # both epochs ran to their end
