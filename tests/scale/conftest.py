"""Synthetic multi-rank runs (benchmarks/synth.py), generated once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.synth import SynthConfig, generate_run  # noqa: E402


@pytest.fixture(scope="session")
def synth_run_16(tmp_path_factory) -> tuple[Path, dict]:
    """16 ranks (tp 4 x dp 4), ~1,500 complete events each, rank 5 computes 1.3x slower."""
    out = tmp_path_factory.mktemp("synth16")
    cfg = SynthConfig(num_ranks=16, events_per_rank=1500, tp=4, straggler_rank=5)
    return out, generate_run(cfg, out)


@pytest.fixture(scope="session")
def synth_run_64(tmp_path_factory) -> tuple[Path, dict]:
    """64 ranks (tp 8 x dp 8), ~600 complete events each, rank 37 computes 1.3x slower."""
    out = tmp_path_factory.mktemp("synth64")
    cfg = SynthConfig(num_ranks=64, events_per_rank=600, tp=8, straggler_rank=37)
    return out, generate_run(cfg, out)


def plain_table(t: pa.Table) -> pa.Table:
    """Dictionary columns as strings, one chunk: tables equal iff their values are."""
    cols = [c.cast(pa.string()) if pa.types.is_dictionary(c.type) else c for c in t.columns]
    return pa.table(dict(zip(t.column_names, cols))).combine_chunks()


def assert_stores_equal(a, b, tables=("ranks", "events", "kernels", "collectives", "steps", "pipeline",
                                      "process_groups", "routing")) -> None:
    for name in tables:
        x, y = plain_table(a.table(name)), plain_table(b.table(name))
        if name == "ranks":  # paths differ only if the inputs do
            assert x.column("source_file").equals(y.column("source_file"))
        assert x.num_rows == y.num_rows, name
        bad = [c for c in x.column_names if not x.column(c).equals(y.column(c))]
        assert not bad, f"{name}: columns {bad} differ"
