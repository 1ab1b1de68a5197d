"""Where the adapters' lines go: the `hotcache.adapters` logger, visible by default.

A training script that configured no logging still shows data_root's line and timed()'s
summaries on stderr, like this:

    INFO hotcache.adapters: data_root path=/mnt/ssd/imagenet source=DATA_ROOT hot=yes ...

While the root logger has no handler, a stderr handler on `hotcache.adapters` prints
them (what PyTorch Lightning does for its own logger); once the application configures
logging (basicConfig, dictConfig, a framework, or a handler of its own on
`hotcache.adapters`), the lines go through its handlers and levels instead, and this
handler stands aside.

The standard API controls them: `logging.getLogger("hotcache").setLevel(logging.WARNING)`
(or "hotcache.adapters") silences the info lines, as for any library; the INFO level
this module gives its logger while logging is unconfigured stands aside for a level set
on it or an ancestor.

One environment variable, HOTCACHE_LOG, chooses the form:
    text   key=value lines (the default)
    json   one JSON object per line
    off    no lines (warnings, such as a stale view of the data, still are; the JSON
           lines file of HOTCACHE_TIMING_LOG is still written)
Any other value is warned about once and the default used: a log setting never stops a
training job.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    _StreamHandler = logging.StreamHandler[TextIO]
else:                 # subscriptable at run time only from Python 3.11
    _StreamHandler = logging.StreamHandler

NAME = "hotcache.adapters"
ENV = "HOTCACHE_LOG"
MODES = ("text", "json", "off")

log = logging.getLogger(NAME)
_warned: set[str] = set()      # HOTCACHE_LOG values already warned about


def mode() -> str:
    """HOTCACHE_LOG: text, json or off; another value is warned about (once) and text used."""
    raw = os.environ.get(ENV, "").strip().lower() or "text"
    if raw in MODES:
        return raw
    if raw not in _warned:
        _warned.add(raw)        # before logging: the warning's own ready() reads mode()
        say(logging.WARNING, "%s=%r is not understood; using text (set it to one of %s, "
            "or unset it)", ENV, os.environ.get(ENV), ", ".join(MODES))
    return "text"


def _level_above() -> int:
    """The level set on a logger above ours (the "hotcache" logger, say), root left out."""
    node = log.parent
    while node is not None and node is not logging.root:
        if node.level != logging.NOTSET:
            return node.level
        node = node.parent
    return logging.NOTSET


def configured() -> bool:
    """Whether the application set up logging: a handler on the root logger, or a
    handler of its own (or propagate=False) on hotcache's logger."""
    return bool(logging.getLogger().handlers) or not log.propagate or \
        any(h is not _default for h in log.handlers)


class _Unconfigured(_StreamHandler):
    """stderr, only while nobody configured logging."""

    def __init__(self) -> None:
        super().__init__()      # sys.stderr, looked up at each line
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def handle(self, record: logging.LogRecord) -> bool:
        if configured():
            return False
        return bool(super().handle(record))


_default = _Unconfigured()
_level_set = False     # whether the INFO level on our logger is ours (not the user's)


def ready(logger: logging.Logger | None = None, level: int = logging.INFO
          ) -> logging.Logger | None:
    """The logger to write a line of `level` to, made visible where logging is
    unconfigured; None for an info line when HOTCACHE_LOG=off. Call it before each line:
    it follows the application's logging setup as it changes."""
    global _level_set
    if mode() == "off" and level < logging.WARNING:
        return None
    if logger is not None and logger is not log:
        return logger               # the caller's own logger: its setup, untouched
    if _default not in log.handlers:
        log.addHandler(_default)
    # The root logger's WARNING would drop an info line nobody asked to drop: INFO on
    # ours, while logging is unconfigured and no logger above ours has a level of its own.
    ours = not configured() and _level_above() == logging.NOTSET
    if ours and log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
        _level_set = True
    elif not ours and _level_set:
        log.setLevel(logging.NOTSET)  # configured now, or a level set above: it decides
        _level_set = False
    return log


def say(level: int, msg: str, *args: object) -> None:
    """Log one line on hotcache's logger at `level`, through ready()."""
    target = ready(level=level)
    if target is not None:
        target.log(level, msg, *args)
