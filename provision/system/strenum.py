"""`StrEnum`: members that are their string values (`str(m)`, f-strings and JSON give
the value). The standard library has it from Python 3.11; on 3.10 the same behaviour
is two lines, so hotcache runs in 3.10 training images too."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:
    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)

__all__ = ["StrEnum"]
