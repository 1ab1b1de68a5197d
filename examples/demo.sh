#!/usr/bin/env bash
# The README's quick start: install hotcache (Debian packages + a venv in .venv), build
# the cache described in examples/loop-none.yaml on a loop-backed image (no spare disk
# needed), then show its status. Run as root. `hotcache teardown demo --yes` undoes it.
set -euo pipefail
cd "$(dirname "$0")/.."
HOTCACHE_MINIMAL=1 bash .ci/install
mkdir -p /var/lib/hotcache
SPEC=${1:-examples/loop-none.yaml}
.venv/bin/hotcache plan "$SPEC"
.venv/bin/hotcache apply "$SPEC" --yes
.venv/bin/hotcache status
