"""The built wheel holds every module, and `hotcache --help` runs from a fresh venv with
only that wheel (and its declared dependencies) installed; installed into a training
environment, it keeps the torch and TensorFlow builds already there.

pyproject.toml lists the packages by hand (package-dir maps provision/ and adapters/
into one namespace); an editable install imports a subpackage missing from that list,
a wheel does not. This test is the check on the list.

The frameworks' wheels are large: pip's own cache (~/.cache/pip) keeps them between
runs, so only a machine's first run downloads them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"provision": "hotcache/provision", "adapters": "hotcache/adapters"}


def build_wheel(out: Path) -> Path:
    """Build from a clean copy of the sources: a build/ folder left in the checkout would
    slip stale modules into the wheel and hide a missing package."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "--wheel-dir", str(out), str(src)], check=True, timeout=300,
                   cwd=out)
    (wheel,) = out.glob("hotcache-*.whl")
    return wheel


def expected_modules() -> set[str]:
    return {f"{FOLDERS[folder]}/{p.relative_to(ROOT / folder).as_posix()}"
            for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def make_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(path)
    return path / "bin"


def pip(bindir: Path, *args) -> None:
    subprocess.run([bindir / "python", "-m", "pip", "--disable-pip-version-check", "--quiet",
                    *map(str, args)], check=True, timeout=1200)


def installed(bindir: Path) -> dict[str, str]:
    """Distribution name (normalised) -> version, as the venv's importlib.metadata says."""
    out = subprocess.run(
        [bindir / "python", "-c",
         ("import json, importlib.metadata as m; print(json.dumps({d.metadata['Name'].lower()"
          ".replace('_', '-'): d.version for d in m.distributions()}))")],
        capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout)


def test_wheel_metadata_leaves_the_frameworks_to_the_user(wheel):
    """Lower bounds for the frameworks, no CPU-only variant, no OpenCV; Python 3.10;
    the licence and the type markers travel with the wheel."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        lines = zf.read(meta).decode().splitlines()
    requires = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    framework = [r for r in requires if r.startswith(("torch", "tensorflow"))]
    assert "torch>=2.1; extra == \"torch\"" in framework
    assert "tensorflow>=2.16; extra == \"tf\"" in framework
    assert not [r for r in framework if "==" in r.split(";")[0] or r.startswith("tensorflow-")]
    assert not [r for r in requires if "opencv" in r and "extra == \"dev\"" not in r]
    # beside tensorflow-cpu (or any other TensorFlow build): the adapters extra, no framework
    adapters = [r.split(";")[0] for r in requires if r.endswith("extra == \"adapters\"")]
    assert adapters and not [r for r in adapters if r.startswith(("torch", "tensorflow"))]
    assert "Requires-Python: >=3.10" in lines
    assert {"hotcache/provision/py.typed", "hotcache/adapters/py.typed"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


# Other builds than the CI's own (.ci/constraints.txt: torch 2.13.0+cpu, tensorflow-cpu
# 2.21.0), as a training image brings them. They go in with --no-compile: nothing here
# imports them, and byte-compiling their thousands of modules costs CPU for nothing.
USERS_TORCH = "torch==2.14.1"
USERS_TF = "tensorflow==2.20.0"


def test_hotcache_torch_keeps_the_users_torch(wheel, tmp_path):
    """The user's torch is PyPI's 2.14.1, the CUDA build a GPU image has. It goes in
    without its CUDA libraries (some 3 GB, and nothing here imports torch), so pip's
    real resolver is asked what `pip install hotcache[torch]` would do (--dry-run
    --report: the same resolution, nothing written) - it would also fetch those
    libraries, as torch's own dependencies, never a torch."""
    bindir = make_venv(tmp_path / "venv")
    pip(bindir, "install", "--no-deps", "--no-compile", USERS_TORCH)
    report = tmp_path / "report.json"
    pip(bindir, "install", "--dry-run", "--report", report, f"{wheel}[torch]")
    plan = {i["metadata"]["name"].lower(): i["metadata"]["version"]
            for i in json.loads(report.read_text())["install"]}
    assert plan.get("hotcache") == "0.1.0"
    assert not {name for name in plan if name == "torch" or name.startswith("torch-")}, plan
    assert installed(bindir)["torch"] == "2.14.1"


def test_hotcache_tf_keeps_the_users_tensorflow(wheel, tmp_path):
    """The user's TensorFlow is PyPI's 2.20, installed without its dependencies (as the
    torch test does; nothing here imports it). pip's real resolver is asked what
    `pip install hotcache[tf]` would do: it keeps that TensorFlow, and brings no second
    TensorFlow distribution (tensorflow-cpu) to overwrite its files. TensorFlow's own
    dependencies, missing here, are in the plan; no tensorflow* is."""
    bindir = make_venv(tmp_path / "venv")
    pip(bindir, "install", "--no-deps", "--no-compile", USERS_TF)
    report = tmp_path / "report.json"
    pip(bindir, "install", "--dry-run", "--prefer-binary", "--report", report, f"{wheel}[tf]")
    plan = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
            for i in json.loads(report.read_text())["install"]}
    assert plan.get("hotcache") == "0.1.0"
    assert not {n for n in plan if n == "tensorflow" or n.startswith("tensorflow-")}, plan
    assert installed(bindir)["tensorflow"] == "2.20.0"


def test_wheel_holds_every_module_and_its_command_runs(wheel, tmp_path):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(expected_modules() - names)
    assert not missing, f"not in the wheel (add the package to pyproject.toml): {missing}"

    env_dir = tmp_path / "venv"
    pip(make_venv(env_dir), "install", wheel)
    help_ = subprocess.run([env_dir / "bin/hotcache", "--help"], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert help_.returncode == 0, help_.stderr
    assert "apply" in help_.stdout and "copy" in help_.stdout
    # The adapters import from the installed wheel too, without typer or pyudev.
    probe = subprocess.run(
        [env_dir / "bin/python", "-c", "import sys, hotcache.adapters, hotcache.adapters."
         "dataroot; print(sorted(m for m in ('typer', 'pyudev') if m in sys.modules))"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"



def test_a_training_image_can_take_the_adapters_alone(wheel, tmp_path):
    """`pip install --no-deps hotcache` (the host CLI's dependencies left out: typer,
    rich, pyudev, pydantic, prometheus-client, PyYAML): data_root() and timed() run on
    the standard library alone (make_loader/make_dataset add pillow, numpy and the
    framework, which the image has)."""
    bindir = make_venv(tmp_path / "venv")
    pip(bindir, "install", "--no-deps", wheel)
    assert set(installed(bindir)) <= {"hotcache", "pip", "setuptools"}
    data = tmp_path / "data"
    data.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTCACHE_", "DATA_"))}
    done = subprocess.run(
        [bindir / "python", "-c", ("from hotcache.adapters import data_root, timed\n"
                                   "root = data_root()\n"
                                   "for _ in timed(range(3), name='plain'):\n    pass\n")],
        env={**env, "DATA_ROOT": str(data)}, capture_output=True, text=True, timeout=120,
        cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert f"data_root path={data} " in done.stderr and "timing plain " in done.stderr
