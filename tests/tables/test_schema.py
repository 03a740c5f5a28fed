"""Every table a run store holds is the one tracekit/tables/schema.py declares: same columns, types
and nullability as read back from the Parquet files, the declared vocabularies in the classified
columns, and no file the schema does not know. Checked on stores the parser writes (one-shot and
chunked, CPU runtime traces with labels and a real GPU trace with memory events)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tracekit.parse.run import parse_run
from tracekit.tables import schema as S

REPO = Path(__file__).resolve().parents[2]
VOCABULARIES = {("kernels", "kind"): S.KERNEL_KINDS, ("events", "role"): S.EVENT_ROLES,
                ("events", "lane"): S.LANES, ("collectives", "op"): S.COLLECTIVE_OPS,
                ("process_groups", "dim"): S.PARALLEL_DIMS}


@pytest.fixture(scope="module", params=["pp_1f1b", "gpu_h100", "pp_1f1b:chunked"])
def store(request, tmp_path_factory):
    name, _, mode = request.param.partition(":")
    out = tmp_path_factory.mktemp(name) / "store"
    budget = 200_000 if mode == "chunked" else None  # bytes: forces the chunked decoder
    return parse_run(REPO / "fixtures" / name, out, progress=False, max_memory_bytes=budget).store


def test_files_match_the_declared_schemas(store):
    files = {p.stem for p in store.path.glob("*.parquet")}
    assert files == set(S.TABLES), f"undeclared or missing tables: {files ^ set(S.TABLES)}"
    for name, declared in S.TABLES.items():
        written = pq.read_schema(store.path / f"{name}.parquet")
        assert [(f.name, f.type, f.nullable) for f in written] == \
               [(f.name, f.type, f.nullable) for f in declared], name


def test_classified_columns_hold_declared_values_only(store):
    seen_rows = 0
    for (name, col), allowed in VOCABULARIES.items():
        values = pc.unique(pq.read_table(store.path / f"{name}.parquet", columns=[col])[col].cast("string"))
        assert set(v for v in values.to_pylist() if v is not None) <= set(allowed), (name, col)
        seen_rows += len(values)
    assert seen_rows > 0


def test_times_are_int64_nanoseconds(store):
    for name, declared in S.TABLES.items():
        for f in declared:
            if f.name in ("ts", "dur", "enqueue_ts"):
                assert str(f.type) == "int64", (name, f.name)
