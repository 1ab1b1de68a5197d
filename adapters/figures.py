"""The figures a timing summary holds, as every sink of them reads them: the `Summary`
of a window or an epoch (timing.py makes them), and the four figures published beside
the loss and the cache (publish.py, pushgateway.py). Standard library only."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .dataroot import current


@dataclass(slots=True)        # not frozen: a frozen init costs more, and this is built often
class Summary:
    name: str
    epoch: int
    batches: int                    # batches delivered, the first one included
    first_batch_s: float | None     # wait for the first batch, kept out of the figures below
    total_wait_s: float             # steady state: batches 2..n
    p50_wait_s: float
    p95_wait_s: float
    p99_wait_s: float
    max_wait_s: float
    step_s: float                   # mean time from one batch's arrival to the next's
    wall_s: float                   # from the first batch's arrival to the last step's end
    wait_share: float | None        # total_wait_s / wall_s
    verdict: str
    worker_load_s: float | None = None   # time workers spent loading samples (PyTorch)
    worker_load_per_batch_s: float | None = None
    window: int | None = None       # periodic lines: the wait figures cover the last N batches
    # Tiered reads (DATA_COLD_ROOT): the share of samples the hot copy served, and the
    # mean wait of batches mostly (>= half) served hot against those mostly served cold.
    hot_share: float | None = None
    hot_batches: int | None = None
    hot_wait_s: float | None = None
    cold_batches: int | None = None
    cold_wait_s: float | None = None
    # Every rank logs its own lines: which one this is (RANK, LOCAL_RANK), when set.
    rank: int | None = None
    local_rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"event": "batch_timing", **asdict(self)}

    def line(self) -> str:
        def ms(s: float) -> str:
            return f"{s * 1e3:.2f}ms"

        share = "n/a" if self.wait_share is None else f"{self.wait_share:.1%}"
        first = "n/a" if self.first_batch_s is None else ms(self.first_batch_s)
        last = f" last={self.window}" if self.window else ""
        text = (f"{self.name} epoch={self.epoch} batches={self.batches}{last} first={first} "
                f"wait p50={ms(self.p50_wait_s)} p95={ms(self.p95_wait_s)} "
                f"p99={ms(self.p99_wait_s)} max={ms(self.max_wait_s)} "
                f"total={self.total_wait_s:.3f}s step={ms(self.step_s)} waiting={share} "
                f"-> {self.verdict}")
        if self.worker_load_s is not None:
            text += f" (workers loaded for {self.worker_load_s:.3f}s)"
        if self.hot_share is not None:
            def mean(s: float | None) -> str:
                return "n/a" if s is None else ms(s)

            text += (f" hot={self.hot_share:.2f} wait hot={mean(self.hot_wait_s)} "
                     f"({self.hot_batches} batches) cold={mean(self.cold_wait_s)} "
                     f"({self.cold_batches} batches)")
        if self.rank is not None:
            text += f" rank={self.rank}"
        if self.local_rank is not None:
            text += f" local_rank={self.local_rank}"
        return text


NAMES = ("wait_p50_ms", "wait_p95_ms", "waiting_share", "hot_fraction")   # what figures() gives


def data_root_now() -> Any:
    """The data root this process resolved last (data_root()), or None."""
    return current()


def hot_fraction(summary: Summary, root: Any = None) -> float | None:
    """Samples read hot: the measured share where reads are tiered, else all or none
    by the data root's state; None when nothing says."""
    if summary.hot_share is not None:
        return summary.hot_share
    if root is None:
        return None
    return 0.0 if root.hot == "no" else 1.0


def figures(summary: Summary, root: Any = None) -> dict[str, float]:
    """The four figures of a summary by name (NAMES), those known."""
    out = {"wait_p50_ms": summary.p50_wait_s * 1e3, "wait_p95_ms": summary.p95_wait_s * 1e3}
    if summary.wait_share is not None:
        out["waiting_share"] = summary.wait_share
    hot = hot_fraction(summary, root)
    if hot is not None:
        out["hot_fraction"] = hot
    return out


