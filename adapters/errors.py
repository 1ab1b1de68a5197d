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


class EmptyClassError(DataRootError, FileNotFoundError):
    """A class folder holds no image the loader reads. A FileNotFoundError as well, the
    type torchvision's ImageFolder raises for it, so code that catches that still does."""


class ImageDecodeError(OSError):
    """An image file could not be decoded; the message names the file. An OSError, as
    Pillow's own errors for a truncated or unreadable image are. Built from one message
    string, so a DataLoader worker's error is raised again in the training process with
    its type."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path
