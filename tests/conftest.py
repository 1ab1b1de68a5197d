"""Shared test setup. With HOTCACHE_FAIL_ON_SKIP=1 (set by .ci/run) any skipped test
fails the session, so a tier cannot silently disappear from CI."""

from __future__ import annotations

import os

import pytest

# `hotcache copy`/`warm` publish progress in node_exporter's folder when it is writable;
# tests that want it name their own folder.
os.environ.setdefault("HOTCACHE_METRICS_DIR", "")


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("HOTCACHE_FAIL_ON_SKIP") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped:
        reporter.write_line(f"FAILED: {len(skipped)} test(s) skipped and "
                            "HOTCACHE_FAIL_ON_SKIP=1 forbids skips:", red=True)
        for rep in skipped:
            reporter.write_line(f"  {rep.nodeid}: {rep.longrepr[-1] if rep.longrepr else ''}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (loop devices, mounts)")
    for item in items:
        if "root" in item.keywords or "vm" in item.keywords:
            item.add_marker(skip)
