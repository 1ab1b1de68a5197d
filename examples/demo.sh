#!/usr/bin/env bash
# The README's first command, as root: install hotcache (Debian packages, and a venv in
# .venv with the torch extra), then show the whole product on two loop-backed images: a
# slow origin (reads throttled like a hard disk's), a fast tier, a verified hot copy, and
# one training epoch before and after, timed batch by batch (examples/demo.py tells it).
#   bash examples/demo.sh            # run it (again: reuses what is there)
#   bash examples/demo.sh --cleanup  # take it all down: caches, mounts, loop devices, images
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "demo.sh: needs root (packages, loop devices, mounts, cgroups): sudo bash $0 $*" >&2
  exit 6
fi
if [ "${1:-}" = --cleanup ]; then
  [ -x .venv/bin/python ] || { echo "nothing to clean up: hotcache was never installed here"; exit 0; }
else
  # The CLI's Debian packages and the torch extra (the loader and Pillow); no test tiers.
  HOTCACHE_MINIMAL=1 HOTCACHE_EXTRAS=torch bash .ci/install
fi
exec .venv/bin/python examples/demo.py "$@"
