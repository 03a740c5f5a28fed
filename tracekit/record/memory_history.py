"""CUDA allocator history for `tracekit record --memory-history` (CUDA only; a no-op elsewhere).

`start_memory_history` turns on `torch.cuda.memory._record_memory_history` when the profiled window
starts; `dump_memory_snapshot` writes the allocator's snapshot (segments, blocks, the recorded
allocation frames) as `memory_snapshot.rank{R}.pickle` when the window's trace is ready, and turns the
history off again. The pickle holds plain data only; tracekit reads it back through
`tracekit.parse.safe_pickle` (never `pickle.load`).
"""

from __future__ import annotations

import pickle
from pathlib import Path

MAX_ENTRIES = 100_000
"""Allocator events kept by the history ring buffer (torch's own default is 9,223,372,036,854,775,807)."""


def snapshot_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"memory_snapshot.rank{rank}.pickle"


def start_memory_history() -> bool:
    """Start recording the CUDA allocator's history; False (and nothing done) without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return False
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
    return True


def dump_memory_snapshot(out_dir: str | Path, rank: int) -> Path | None:
    """Write this rank's allocator snapshot and stop the history; None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    snap = torch.cuda.memory._snapshot()
    path = snapshot_path(out_dir, rank)
    with open(path, "wb") as fh:
        pickle.dump(snap, fh, protocol=4)
    torch.cuda.memory._record_memory_history(enabled=None)
    return path
