"""The built wheel holds every module, and `hotcache --help` runs from a fresh venv with
only that wheel (and its declared dependencies) installed.

pyproject.toml lists the packages by hand (package-dir maps provision/ and adapters/
into one namespace); an editable install imports a subpackage missing from that list,
a wheel does not. This test is the check on the list."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"provision": "hotcache/provision", "adapters": "hotcache/adapters"}


def build_wheel(out: Path) -> Path:
    """Build from a clean copy of the sources: a build/ folder left in the checkout would
    slip stale modules into the wheel and hide a missing package."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
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


def test_wheel_holds_every_module_and_its_command_runs(tmp_path):
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(expected_modules() - names)
    assert not missing, f"not in the wheel (add the package to pyproject.toml): {missing}"

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    subprocess.run([env_dir / "bin/pip", "install", "--quiet", "--disable-pip-version-check",
                    wheel], check=True, timeout=600)
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

