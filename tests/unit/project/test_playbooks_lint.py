"""The Ansible role and playbooks pass ansible-lint's production profile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PLAYBOOKS = Path(__file__).resolve().parents[3] / "playbooks"


def test_ansible_lint_production_profile(tmp_path):
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
           "ANSIBLE_HOME": str(tmp_path / "ansible-home"), "NO_COLOR": "1"}
    proc = subprocess.run([str(venv_bin / "ansible-lint"), "--nocolor"], cwd=PLAYBOOKS,
                          capture_output=True, text=True, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Profile 'production' was required, and it passed" in out


ROLE = PLAYBOOKS / "roles" / "hotcache"


def argument_specs() -> dict:
    import yaml

    return yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]


def test_argument_specs_cover_every_default_and_every_entry_point():
    """Each variable of defaults/main.yml has a type in the spec and the spec names no
    variable the role does not have; site.yml (main) and each tasks_from entry point
    (teardown, status, grafana) are checked with the same options."""
    import yaml

    specs = argument_specs()
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    options = specs["main"]["options"]
    assert set(options) == set(defaults)
    assert all(o.get("type") for o in options.values())
    entry_points = {p.stem for p in (ROLE / "tasks").glob("*.yml")} & {"teardown", "status",
                                                                        "grafana"}
    assert set(specs) == {"main", *entry_points}
    for name, spec in specs.items():
        assert spec["options"] == options, name


def test_argument_specs_of_a_cache_are_the_host_specs_fields():
    """The options of one cache are CacheSpec's fields (and filesystem's, Filesystem's),
    and the choices are what the spec accepts: the backends of the registry."""
    import typing

    from hotcache.provision.backends import BACKENDS
    from hotcache.provision.engine.spec import CacheSpec, Filesystem

    cache = argument_specs()["main"]["options"]["hotcache_caches"]
    assert (cache["type"], cache["elements"]) == ("list", "dict")
    assert set(cache["options"]) == set(CacheSpec.model_fields)
    assert cache["options"]["backend"]["choices"] == list(BACKENDS)
    assert {k for k, o in cache["options"].items() if o.get("required")} == \
        {k for k, f in CacheSpec.model_fields.items() if f.is_required()}
    fs = cache["options"]["filesystem"]["options"]
    assert set(fs) == set(Filesystem.model_fields)
    for key in ("type", "persist"):
        assert fs[key]["choices"] == list(typing.get_args(Filesystem.model_fields[key].annotation))
    assert {k for k, o in fs.items() if o.get("required")} == \
        {k for k, f in Filesystem.model_fields.items() if f.is_required()}
