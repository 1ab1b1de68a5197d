"""A wrapper that stands in for what it wraps (a DataLoader, a tf.data pipeline): len()
and every attribute it does not define itself (.dataset, .sampler, .batch_size ...)
come from the wrapped iterable."""

from __future__ import annotations

from typing import Any


class StandsIn:
    iterable: Any

    def __len__(self) -> int:
        return len(self.iterable)

    def __getattr__(self, attr: str) -> Any:
        if attr == "iterable":      # not set yet (copy, pickle): no endless recursion
            raise AttributeError(attr)
        return getattr(self.iterable, attr)
