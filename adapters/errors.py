"""The errors the training adapters raise. They are HotcacheErrors, so `python -m
hotcache.adapters` and the CLI report them alike; their exit codes come from the one
table in provision/errors.py (ExitCode)."""

from __future__ import annotations

from hotcache.provision.errors import ExitCode, HotcacheError


class DataRootError(HotcacheError):
    """DATA_ROOT is unset, missing, or not the hot copy asked for."""

    exit_code = ExitCode.BAD_INPUT


class CacheLockedError(HotcacheError):
    """A tf.data cache directory is locked by a running job, or by one we cannot identify."""

    exit_code = ExitCode.REFUSED
