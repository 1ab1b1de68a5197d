"""Byte sizes: for people (1.5 GiB, not 1610612736), and the one grammar hotcache reads
them in."""

from __future__ import annotations

import re


def size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'2G', '512MiB', '1.5T', '300' -> bytes: the one size grammar of hotcache (the
    spec's sizes, --budget, --bwlimit). K, M, G, T, P are powers of 1024; a trailing B or
    iB is allowed. ValueError unless it is a positive size."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not a size: write it like 512M, 2G or 1T")
    value = int(float(m.group(1)) * 1024 ** " kmgtp".index(m.group(2).lower() or " "))
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive size")
    return value
