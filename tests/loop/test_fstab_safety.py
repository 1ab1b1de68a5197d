"""The fstab, on a temp fstab (HOTCACHE_FSTAB): control characters are refused in
the spec, and an fstab entry is removed only when marker, UUID and mountpoint all match:
an orphaned `# hotcache:NAME` marker never takes the next line with it, even `/`'s."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from hotcache.provision import mapping
from tests.helpers import hotcache, loop_spec, loops_under, mounts_under

pytestmark = pytest.mark.root

ROOT_LINE = "UUID=0b5e-root / ext4 errors=remount-ro 0 1"


def sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@pytest.mark.parametrize("field, value", [
    ("mountpoint", '"{mnt}/hot\\nnofail"'),
    ("mountpoint", '"{mnt}/ho\\tt"'),
    ("label", '"hot\\x07"'),
])
def test_control_characters_are_refused_naming_the_field(sandbox, field, value):
    fstab = Path(os.environ["HOTCACHE_FSTAB"])
    fstab.write_text(ROOT_LINE + "\n")
    before = sha(fstab)
    spec = sandbox / "spec.yaml"
    text = loop_spec(sandbox)
    if field == "mountpoint":
        text = text.replace(f"mountpoint: {sandbox}/mnt/hot",
                            "mountpoint: " + value.format(mnt=sandbox / "mnt"))
    else:
        text += f"      label: {value}\n"
    spec.write_text(text)
    proc = hotcache("apply", spec, "--yes")
    assert proc.returncode == 2, proc.stderr
    assert f"caches[0].filesystem.{field}" in proc.stderr and "control character" in proc.stderr
    assert sha(fstab) == before and not (sandbox / "hot.img").exists()
    assert not Path(os.environ["HOTCACHE_STATE"]).exists() and loops_under(sandbox) == []


def test_an_orphaned_marker_never_takes_the_root_line_with_it(sandbox):
    fstab = Path(os.environ["HOTCACHE_FSTAB"])
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    ours = [line for line in fstab.read_text().splitlines() if line.startswith("UUID=")]
    assert len(ours) == 1
    # An administrator deletes hotcache's line but leaves its marker above /'s line, and
    # another marker of the same cache lies orphaned at the end above a swap line.
    fstab.write_text(f"# hotcache:hot\n{ROOT_LINE}\n"
                     "# hotcache:hot\n/dev/sdz2 none swap sw 0 0\n")

    proc = hotcache("apply", spec, "--yes")                # rewrites its own entry
    assert proc.returncode == 0, proc.stderr
    lines = fstab.read_text().splitlines()
    assert ROOT_LINE in lines and "/dev/sdz2 none swap sw 0 0" in lines
    assert lines.count(ours[0]) == 1 and lines.count("# hotcache:hot") == 1
    assert lines[lines.index("# hotcache:hot") + 1] == ours[0]

    fstab.write_text(f"# hotcache:hot\n{ROOT_LINE}\n# hotcache:hot\n"
                     f"{ours[0].replace('/mnt/hot', '/mnt/other')}\n")
    proc = hotcache("teardown", "hot", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert fstab.read_text() == f"{ROOT_LINE}\n{ours[0].replace('/mnt/hot', '/mnt/other')}\n", \
        "a line with hotcache's UUID but another mountpoint is not hotcache's entry"
    assert mapping.load(Path(os.environ["HOTCACHE_STATE"]))["caches"] == {}
    assert mounts_under(sandbox) == []
