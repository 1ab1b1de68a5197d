"""examples/container: the compose file and Dockerfile keep what
docs/containers-and-kubernetes.md promises
(no container runtime runs on the test machine; tests/loop/test_kube_loop.py runs
data_root() in a mount namespace set up as a runtime does)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "container"


def test_compose_binds_read_only_with_rslave_as_a_user_with_shared_memory():
    (svc,) = yaml.safe_load((EXAMPLES / "compose.yaml").read_text())["services"].values()
    uid, _, gid = svc["user"].partition(":")
    assert int(uid) > 0 and int(gid) > 0
    assert svc.get("shm_size") or svc.get("ipc") == "host"
    assert svc["environment"]["DATA_ROOT_EXPECT"] == "hot"
    (data,) = [v for v in svc["volumes"] if svc["environment"]["DATA_ROOT"].startswith(v["target"] + "/")]
    assert data["type"] == "bind" and data["read_only"] and data["bind"]["propagation"] == "rslave"
    assert any(v["target"] == "/etc/hotcache" and v["read_only"] for v in svc["volumes"])
    assert (EXAMPLES.parents[1] / svc["build"]["dockerfile"]).resolve() == EXAMPLES / "Dockerfile"


def test_dockerfile_runs_as_non_root_and_checks_the_data_root():
    text = (EXAMPLES / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\S+)", text, re.M)
    assert int(user.split(":")[0]) > 0
    assert "DATA_ROOT_EXPECT=hot" in text
    assert '"-m", "hotcache.adapters"' in text
    run = re.search(r"docker run .*?hotcache-train:latest", text, re.S).group(0)
    for flag in ("--user 1000:1000", "readonly,bind-propagation=rslave", "--shm-size"):
        assert flag in run
