"""The playbooks, run for real: `ansible-playbook -c local` against this host with a
loop-backed cache, every path (image, mountpoint, mapping, fstab, units, metrics file,
report) under a tmp folder.

One module-scoped sequence, as an administrator would run it: check mode on a fresh
host, apply, apply again, check mode again, gather the fleet report, tear down. Each test reads what its
step left behind; the steps run once (Ansible is slow to start).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hotcache.provision.observe import nodelabels
from tests import kubecheck

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"
VENV_BIN = Path(sys.executable).parent
RECAP = re.compile(r"^localhost\s*:\s*(.*)$", re.MULTILINE)


class Fleet:
    def __init__(self, root: Path):
        self.root = root
        self.image = root / "ssd.img"
        self.mnt = root / "mnt"
        self.state = root / "etc" / "mappings.yaml"
        self.fstab = root / "etc" / "fstab"
        self.units = root / "units"
        self.spec = root / "etc" / "spec.yml"
        self.textfile = root / "textfile" / "hotcache.prom"
        self.report = root / "fleet.json"
        self.labels = root / "features.d" / "hotcache"
        self.manifests = root / "manifests"
        self.grafana = root / "grafana"
        self.slurm = root / "slurm"
        self.libexec = root / "libexec"
        self.cache = f"ans{os.getpid() % 100000}"
        self.inventory = root / "inventory.yml"
        host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                "ansible_become": False}  # already root; no sudo on CI hosts
        self.inventory.write_text(yaml.safe_dump({"grafana": {"hosts": {"localhost": host}},
                                                  "hotcache": {
            "hosts": {"localhost": host},
            "vars": {
                "hotcache_install": False,           # the venv running the tests has it
                "hotcache_venv": str(VENV_BIN.parent),
                "hotcache_spec_path": str(self.spec),
                "hotcache_state": str(self.state),
                "hotcache_fstab": str(self.fstab),
                "hotcache_unit_dir": str(self.units),
                "hotcache_metrics_textfile": str(self.textfile),
                "hotcache_report": str(self.report),
                "hotcache_node_labels": True,
                "hotcache_node_labels_file": str(self.labels),
                "hotcache_kube_manifests_dir": str(self.manifests),
                "hotcache_kube_node": "gpu-test-1",
                "hotcache_slurm_node": True,
                "hotcache_slurm_conf_dir": str(self.slurm),
                "hotcache_slurm_libexec_dir": str(self.libexec),
                "hotcache_slurm_features": ["hc_toy_3"],
                "hotcache_grafana_provisioning_dir": str(self.grafana / "provisioning"),
                "hotcache_grafana_dashboards_dir": str(self.grafana / "dashboards"),
                "hotcache_caches": [{
                    "name": self.cache, "backend": "none",
                    "origin": {"loop": {"file": str(self.image), "size": "320M"}},
                    "filesystem": {"mountpoint": str(self.mnt), "mode": "0755"},
                }],
            },
        }}))
        self.runs: dict[str, subprocess.CompletedProcess] = {}

    def play(self, key: str, playbook: str, *args: str) -> dict[str, int]:
        env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
               "ANSIBLE_HOME": str(self.root / "ansible-home"),
               "ANSIBLE_LOCAL_TEMP": str(self.root / "ansible-tmp"),
               "ANSIBLE_REMOTE_TEMP": str(self.root / "ansible-tmp"),
               "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0"}
        proc = subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), "-i", str(self.inventory),
             str(PLAYBOOKS / playbook), *args],
            capture_output=True, text=True, env=env, timeout=600, cwd=self.root)
        self.runs[key] = proc
        assert proc.returncode == 0, f"{playbook} {args} failed:\n{proc.stdout}\n{proc.stderr}"
        return recap(proc.stdout)

    def mapping(self) -> dict:
        return yaml.safe_load(self.state.read_text()) if self.state.exists() else {}

    def loop_attached(self) -> bool:
        out = subprocess.run(["losetup", "--associated", str(self.image)],
                             capture_output=True, text=True).stdout
        return bool(out.strip())

    def mounted(self) -> bool:
        target = os.path.realpath(self.mnt)
        return any(line.split()[4] == target for line in
                   Path("/proc/self/mountinfo").read_text().splitlines())

    def cleanup(self) -> None:
        """Only what this module made, whatever step failed."""
        if self.mounted():
            subprocess.run(["umount", str(self.mnt)], check=False)
        if self.image.exists():
            for line in subprocess.run(["losetup", "--associated", str(self.image)],
                                       capture_output=True, text=True).stdout.splitlines():
                subprocess.run(["losetup", "--detach", line.split(":")[0]], check=False)


def recap(stdout: str) -> dict[str, int]:
    found = RECAP.findall(stdout)
    assert found, f"no PLAY RECAP for localhost in:\n{stdout}"
    counts: dict[str, int] = {}
    for line in found:  # one recap line per playbook run; sum is fine, there is one
        for key, value in re.findall(r"(\w+)=(\d+)", line):
            counts[key] = counts.get(key, 0) + int(value)
    return counts


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("ansible"))
    try:
        f.recaps = {}
        # The install tasks run too, in check mode only: pip only lists what the venv
        # has (a real install into a fresh venv needs the package index).
        f.recaps["check"] = f.play("check", "site.yml", "--check", "-e", "hotcache_install=true",
                                   "-e", f"hotcache_source={REPO}",
                                   "-e", "hotcache_install_packages=false")
        f.after_check = {"image": f.image.exists(), "state": f.state.exists(),
                         "fstab": f.fstab.exists(), "mounted": f.mounted(),
                         "units": f.units.exists(), "spec": f.spec.exists(),
                         "textfile": f.textfile.exists()}
        f.recaps["first"] = f.play("first", "site.yml")
        f.after_first = {"mapping": f.mapping(), "mounted": f.mounted(),
                         "fstab": f.fstab.read_text(), "units": sorted(os.listdir(f.units)),
                         "textfile": f.textfile.read_text(),
                         "service": (f.units / "hotcache-metrics.service").read_text(),
                         "labels": f.labels.read_text(),
                         "manifests": (f.manifests / "localhost.yaml").read_text(),
                         "helpers": (f.slurm / "helpers.conf").read_text()}
        f.recaps["second"] = f.play("second", "site.yml")
        f.recaps["check-converged"] = f.play("check-converged", "site.yml", "--check")
        f.recaps["status"] = f.play("status", "status.yml")
        f.recaps["grafana"] = f.play("grafana", "grafana.yml")
        f.recaps["grafana-again"] = f.play("grafana-again", "grafana.yml")
        f.recaps["teardown"] = f.play("teardown", "teardown.yml")
        yield f
    finally:
        f.cleanup()


def test_check_mode_changes_nothing_but_says_it_would(fleet):
    assert fleet.after_check == {k: False for k in fleet.after_check}
    assert fleet.recaps["check"]["changed"] > 0
    # The plan's steps are shown: the loop image would be created and formatted.
    out = fleet.runs["check"].stdout
    assert "create sparse image" in out and "format" in out
    install = out.split("TASK [hotcache : Install hotcache into its virtualenv]")[1]
    assert install.split("\n")[1].startswith("changed: [localhost]")


def test_first_run_builds_the_cache(fleet):
    assert fleet.recaps["first"]["changed"] >= 3  # spec file, apply, metrics timer
    entry = fleet.after_first["mapping"]["caches"][fleet.cache]
    assert entry["state"] == "ready"
    assert fleet.after_first["mounted"]
    assert f"# hotcache:{fleet.cache}" in fleet.after_first["fstab"]
    assert "nofail" in fleet.after_first["fstab"]
    assert fleet.after_first["units"] == ["hotcache-metrics.service", "hotcache-metrics.timer"]
    assert f'hotcache_cache_up{{cache="{fleet.cache}"}} 1.0' in fleet.after_first["textfile"]
    check = subprocess.run(["promtool", "check", "metrics"], input=fleet.after_first["textfile"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_metrics_service_uses_the_redirected_paths(fleet):
    service = fleet.after_first["service"]
    assert f"Environment=HOTCACHE_STATE={fleet.state}" in service
    assert f"Environment=HOTCACHE_FSTAB={fleet.fstab}" in service
    assert f"status --prometheus {fleet.textfile}" in service


def test_second_run_changes_nothing(fleet):
    counts = fleet.recaps["second"]
    assert counts["changed"] == 0, fleet.runs["second"].stdout
    assert counts["failed"] == 0


def test_check_mode_on_a_converged_host_reports_nothing_to_do(fleet):
    assert fleet.recaps["check-converged"]["changed"] == 0, fleet.runs["check-converged"].stdout


def test_status_report_on_the_controller(fleet):
    report = json.loads(fleet.report.read_text())
    assert report["ok"] is True
    host = report["hosts"]["localhost"]
    assert host["ok"] is True
    (row,) = [c for c in host["caches"] if c["name"] == fleet.cache]
    assert row["mounted"] and row["noatime"] and row["persistent"]
    assert host["doctor"]["problems"] == 0
    # The one change is the report written on the controller; the hosts are only read.
    assert fleet.recaps["status"]["changed"] == 1


def test_teardown_leaves_nothing_behind(fleet):
    assert fleet.recaps["teardown"]["changed"] > 0
    assert not fleet.mounted()
    assert not fleet.loop_attached()
    assert f"hotcache:{fleet.cache}" not in (fleet.fstab.read_text() if fleet.fstab.exists() else "")
    assert fleet.cache not in fleet.mapping().get("caches", {})
    assert not fleet.spec.exists()
    assert not fleet.textfile.exists()
    assert not fleet.labels.exists()
    assert not any(fleet.units.iterdir())


def test_node_labels_written_and_refreshed_by_the_timer(fleet):
    labels = kubecheck.parse_feature_file(fleet.after_first["labels"],
                                          dt.datetime.now(dt.timezone.utc))
    assert labels == {f"{nodelabels.PREFIX}/cache-{fleet.cache}": "none",
                      f"{nodelabels.PREFIX}/cache-{fleet.cache}.mode": "none"}
    assert f"--node-labels {fleet.labels}" in fleet.after_first["service"]


def test_slurm_helpers_conf_and_scripts_installed(fleet):
    helper = fleet.libexec / "hotcache-slurm-features"
    assert f"\nFeature=hc_toy_3 Helper={helper}\n" in fleet.after_first["helpers"]
    assert fleet.after_first["helpers"].startswith("# BEGIN hotcache features")
    # the scripts run hotcache with the role's mapping: no verified copy, no feature;
    # a job naming a dataset not here is told to expect hot (data_root() then fails)
    found = subprocess.run([helper], capture_output=True, text=True)
    assert found.returncode == 0 and found.stdout == "", found.stderr
    prolog = subprocess.run([fleet.libexec / "hotcache-slurm-task-prolog"],
                            capture_output=True, text=True,
                            env={**os.environ, "HOTCACHE_DATASET": "toy"})
    assert prolog.returncode == 0, prolog.stderr
    assert prolog.stdout.splitlines()[-1] == "export DATA_ROOT_EXPECT=hot"
    assert str(fleet.state) in helper.read_text()


def test_manifests_collected_on_the_controller(fleet):
    docs = kubecheck.validate_manifests(fleet.after_first["manifests"])
    assert [d["kind"] for d in docs] == ["StorageClass"]   # no hot copy on this cache yet


def test_grafana_dashboard_installed_into_provisioning(fleet):
    board = fleet.grafana / "dashboards" / "hotcache-dashboard.json"
    assert json.loads(board.read_text()) == json.loads(
        (REPO / "playbooks" / "grafana" / "hotcache-dashboard.json").read_text())
    provider = yaml.safe_load((fleet.grafana / "provisioning" / "dashboards" / "hotcache.yaml").read_text())
    (p,) = provider["providers"]
    assert p["type"] == "file" and p["options"]["path"] == str(board.parent)
    assert fleet.recaps["grafana"]["changed"] == 4
    assert fleet.recaps["grafana-again"]["changed"] == 0


@pytest.mark.parametrize("playbook, bad, says", [
    ("site.yml", {"hotcache_caches": [{"name": "c", "backend": "zfs",
                                       "origin": "/dev/disk/by-id/virtio-hdd",
                                       "filesystem": {"mountpoint": "/mnt/c"}}]},
     "value of backend must be one of: none, bcache, dm-cache, lvmcache, got: zfs"),
    ("site.yml", {"hotcache_caches": [{"name": "c", "backend": "none", "origin": "/dev/vdb",
                                       "filesystem": {"mount_point": "/mnt/c"}}]},
     "mount_point"),
    ("teardown.yml", {"hotcache_teardown_wipe": "perhaps"}, "hotcache_teardown_wipe"),
])
def test_a_bad_variable_is_refused_before_any_task(tmp_path, playbook, bad, says):
    """ansible-playbook itself checks the role's meta/argument_specs.yml: the play stops
    at the validation, naming the variable, before any task of the role (no spec
    rendered, no command run)."""
    spec = tmp_path / "spec.yml"
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "ansible_become": False}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"hotcache": {"hosts": {"localhost": host}, "vars": {
        "hotcache_install": False, "hotcache_venv": str(VENV_BIN.parent),
        "hotcache_spec_path": str(spec), "hotcache_state": str(tmp_path / "m.yaml"),
        "hotcache_fstab": str(tmp_path / "fstab"), "hotcache_unit_dir": str(tmp_path / "u"),
        "hotcache_metrics_timer": False}}}))
    extra = tmp_path / "bad.yml"
    extra.write_text(yaml.safe_dump(bad))
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
           "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_RETRY_FILES_ENABLED": "0"}
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory),
                           str(PLAYBOOKS / playbook), "-e", f"@{extra}"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    tasks = re.findall(r"^TASK \[(.*?)\]", proc.stdout, re.MULTILINE)
    entry = "main" if playbook == "site.yml" else "teardown"
    (task,) = [t for t in tasks if t.startswith("hotcache : ")]   # the role's only task
    assert f"Validating arguments against arg spec '{entry}'" in task, tasks
    assert says in out, out
    counts = recap(proc.stdout)     # (teardown.yml's include_role counts as ok)
    assert (counts["changed"], counts["failed"]) == (0, 1), counts
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("ansible")) == \
        ["bad.yml", "inventory.yml"]
