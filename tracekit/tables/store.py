"""A run store: a folder of Parquet files, one per table, plus `meta.json` (inputs, skipped, manifest).

Writers append one row group per rank so memory does not grow with the number of ranks; readers
scan with column projection and filters (pyarrow dataset) or SQL (DuckDB views over the files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracekit.errors import StoreError
from tracekit.tables.schema import TABLES, conform

STORE_SCHEMA = "tracekit.store/1"


ROW_GROUP_ROWS = 1 << 18
"""Most rows per Parquet row group: the writer holds one encoded row group in memory, so a rank with
millions of events never builds one huge group (alone it changed the chunked path's peak little; writing
the chunks part by part did that, see parse/spilled.py)."""


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The text columns: only they are dictionary-encoded in Parquet. Dictionary pages for int64 times
    and ids (nearly all distinct) cost time and space: for a 94 MB trace's tables 0.14 -> 0.10 s of
    CPU and 4.7 -> 3.0 MB with zstd (values identical; readers see the same Arrow schema)."""
    return [f.name for f in schema if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)
            or pa.types.is_large_string(f.type)]


COMPRESSION = "lz4"
"""Parquet codec of the store. Each analyzer reads a rank's rows again (~17 reads per rank on HTA's sampled
run), so decoding speed counts more than size: against zstd, per rank of that run's events (4,743 rows) a
write 3.1 -> 2.0 ms and a read 1.4 -> 0.9 ms of CPU, 63 -> 107 kB (benchmarks: DuckDB reads it too)."""


def statistics_columns(schema: pa.Schema) -> list[str]:
    """The columns whose row-group min/max the store writes: `rank` only. Readers find a rank's row groups
    by it (`RunStore._rank_row_groups`); a filter on another column scans every row group of a run anyway
    (each rank's groups hold all its steps, names and times). The other columns' statistics cost a third of
    a write (events: 2.0 -> 1.6 ms per rank with lz4)."""
    return ["rank"] if schema.get_field_index("rank") >= 0 else []


@dataclass
class RunStoreWriter:
    """Writes tables incrementally into STORE/<table>.parquet and STORE/meta.json on close."""

    path: Path
    meta: dict[str, Any] = field(default_factory=dict)
    _writers: dict[str, pq.ParquetWriter] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.meta.setdefault("schema", STORE_SCHEMA)
        self.meta.setdefault("inputs", {"ranks": [], "skipped": []})

    def append(self, name: str, table: pa.Table) -> None:
        """Append rows (conformed to the declared schema) to table `name`."""
        table = conform(name, table)
        writer = self._writers.get(name)
        if writer is None:
            writer = pq.ParquetWriter(self.path / f"{name}.parquet", TABLES[name], compression=COMPRESSION,
                                      use_dictionary=dictionary_columns(TABLES[name]),
                                      write_statistics=statistics_columns(TABLES[name]))
            self._writers[name] = writer
        if table.num_rows:
            # a rank's rows may span several row groups (the index maps a rank to all of its own), but
            # never share one with another rank; bounded groups bound the writer's buffers
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)

    def skip(self, file: str, reason: str) -> None:
        """Record an input that was not analysed, with the reason (shown in reports)."""
        self.meta["inputs"]["skipped"].append({"file": str(file), "reason": reason})

    def close(self) -> "RunStore":
        for name in TABLES:
            if name not in self._writers:
                self.append(name, TABLES[name].empty_table())
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        (self.path / "meta.json").write_text(json.dumps(self.meta, indent=2, sort_keys=True, default=str))
        return RunStore(self.path)

    def __enter__(self) -> "RunStoreWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RunStore:
    """Read access to a run store directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.is_file():
            raise StoreError(f"{self.path}: not a tracekit run store (no meta.json)")
        try:
            meta = json.loads(meta_path.read_text())
        except (ValueError, OSError) as exc:  # a store cut off mid-write, or not ours
            raise StoreError(f"{meta_path}: unreadable run store metadata ({exc})") from None
        if not isinstance(meta, dict):
            raise StoreError(f"{meta_path}: run store metadata is not a JSON object")
        self.meta: dict[str, Any] = meta
        self._files: dict[str, pq.ParquetFile] = {}
        """Open Parquet files, footer read once (`_parquet_file`)."""
        self._rank_index: dict[str, tuple[pq.ParquetFile, dict[int, list[int]]] | None] = {}
        """Table -> (file, rank -> row groups), or None when row groups mix ranks (`_rank_row_groups`)."""

    def file(self, name: str) -> Path:
        return self.path / f"{name}.parquet"

    def has(self, name: str) -> bool:
        return self.file(name).is_file()

    def dataset(self, name: str) -> "ds.Dataset":
        import pyarrow.dataset as ds  # imports pandas (~0.4 s): only readers pay for it, never `tracekit parse`

        if not self.has(name):
            return ds.dataset(TABLES[name].empty_table())
        return ds.dataset(self.file(name), format="parquet")

    def columns(self, name: str) -> list[str]:
        """The columns table `name`'s file holds (from its footer; none when there is no file)."""
        return self._parquet_file(name).schema_arrow.names if self.has(name) else []

    def table(self, name: str, columns: Iterable[str] | None = None, filter: Any = None) -> pa.Table:
        """Read table `name` with optional column projection and a pyarrow filter expression (a filter
        scans the dataset, which skips row groups by their statistics; without one the file is read
        straight: an analysis reads ~40 small tables, each dataset costing ~1 ms to set up)."""
        cols = list(columns) if columns is not None else None
        later = self._added_since_written(name, cols)
        if later:
            cols = [c for c in cols if c not in later]
        if filter is None and self.has(name):
            out = self._parquet_file(name).read(columns=cols)
        else:
            out = self.dataset(name).to_table(columns=cols, filter=filter)
        for c in later:  # a column this version declares that the store's writer did not have: unknown
            out = out.append_column(TABLES[name].field(c), pa.nulls(out.num_rows, TABLES[name].field(c).type))
        return out.select(list(columns)) if later else out

    def _added_since_written(self, name: str, cols: list[str] | None) -> list[str]:
        """Requested nullable columns of the declared schema that the table's file lacks (a store written
        by an earlier tracekit version); other missing names still fail as unknown columns."""
        if cols is None or not self.has(name) or name not in TABLES:
            return []
        have = set(self._parquet_file(name).schema_arrow.names)
        declared = TABLES[name]
        return [c for c in cols if c not in have and declared.get_field_index(c) >= 0
                and declared.field(c).nullable]

    def _parquet_file(self, name: str) -> pq.ParquetFile:
        """The table's open Parquet file (footer read once per store). Without pre-buffering: a rank's row
        group is read column chunk by column chunk straight from the local file; pre-buffering (pyarrow's
        default) coalesces the reads through its I/O thread pool, which costs more CPU than it saves on a
        local disk (a rank's events, 2 of 20 columns: 0.24 -> 0.14 ms; 9 columns: ~0.55 -> ~0.52 ms)."""
        files = self._files
        if name not in files:
            files[name] = pq.ParquetFile(self.file(name), pre_buffer=False)
        return files[name]

    def grouped_sum(self, name: str, keys: list[str], value: str, filter: Any = None,
                    batch_size: int = 1 << 17) -> dict[tuple, float]:
        """Sum of `value` per distinct `keys` over rows matching `filter` (nulls in a key are left
        out), scanned record batch by record batch: memory stays one batch whatever the table's size."""
        acc: dict[tuple, float] = {}
        if not self.has(name):
            return acc
        keep = pc.is_valid(pc.field(value))
        for k in keys:
            keep = keep & pc.is_valid(pc.field(k))
        keep = keep if filter is None else keep & filter
        for batch in self.dataset(name).to_batches(columns=[*keys, value], filter=keep, batch_size=batch_size):
            if not batch.num_rows:
                continue
            g = pa.Table.from_batches([batch]).group_by(keys).aggregate([(value, "sum")])
            for *key, total in zip(*(g.column(k).to_pylist() for k in keys), g.column(f"{value}_sum").to_pylist()):
                acc[tuple(key)] = acc.get(tuple(key), 0) + total
        return acc

    def rank_table(self, name: str, rank: int, columns: Iterable[str] | None = None) -> pa.Table:
        """Rows of one rank only: its row groups straight from the file when every row group holds a
        single rank (what RunStoreWriter writes), else predicate pushdown on the dataset."""
        index = self._rank_row_groups(name)
        if index is None:
            return self.table(name, columns, pc.field("rank") == rank)
        pf, groups = index
        cols = list(columns) if columns is not None else None
        if not groups.get(rank):
            empty = TABLES[name].empty_table()
            return empty.select(cols) if cols is not None else empty
        return pf.read_row_groups(groups[rank], columns=cols, use_threads=False)

    def rank_rows(self, name: str, rank: int) -> int | None:
        """How many rows of table `name` one rank has, from the footer (`_rank_row_groups`); None when the
        store cannot tell without reading (row groups mixing ranks)."""
        if not self.has(name):
            return 0
        index = self._rank_row_groups(name)
        if index is None:
            return None
        pf, groups = index
        return sum(pf.metadata.row_group(i).num_rows for i in groups.get(rank, ()))

    def _rank_row_groups(self, name: str) -> tuple[pq.ParquetFile, dict[int, list[int]]] | None:
        """(open file, rank -> row-group indices) from the footer statistics, cached; None when a row
        group mixes ranks or lacks statistics. Reading by index keeps per-rank reads O(1) in the
        number of ranks (a filtered dataset scan checks every row group's statistics each time)."""
        cache = self._rank_index
        if name not in cache:
            cache[name] = None
            if self.has(name):
                pf = self._parquet_file(name)
                md = pf.metadata
                col = pf.schema_arrow.get_field_index("rank")
                groups: dict[int, list[int]] | None = {} if col >= 0 else None
                for i in range(md.num_row_groups if groups is not None else 0):
                    rg = md.row_group(i)
                    if rg.num_rows == 0:
                        continue
                    st = rg.column(col).statistics
                    if st is None or not st.has_min_max or st.min != st.max:
                        groups = None
                        break
                    groups.setdefault(int(st.min), []).append(i)
                cache[name] = (pf, groups) if groups is not None else None
        return cache[name]

    def ranks(self) -> list[int]:
        return sorted(self.table("ranks", ["rank"]).column("rank").to_pylist())

    @property
    def skipped(self) -> list[dict[str, str]]:
        return list(self.meta.get("inputs", {}).get("skipped", []))

    @property
    def manifest(self) -> dict[str, Any] | None:
        return self.meta.get("manifest")

    def duckdb(self):
        """A DuckDB connection with one view per table."""
        import duckdb

        con = duckdb.connect()
        for name in TABLES:
            if self.has(name):
                path = str(self.file(name)).replace("'", "''")
                con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
        return con

    def sql(self, query: str, extra: dict[str, pa.Table] | None = None) -> pa.Table:
        """Run a DuckDB SQL query over the store's tables (and `extra` Arrow tables, e.g. derived ones,
        under their names) and return an Arrow table."""
        con = self.duckdb()
        for name, table in (extra or {}).items():
            con.register(name, table)
        try:
            rel = con.sql(query)
            if rel is None:  # a statement without a result (e.g. SET)
                return pa.table({})
            # duckdb >= 2.0: to_arrow_table (fetch via execute() warns about an extra copy); older: arrow.
            fetch = getattr(rel, "to_arrow_table", None) or rel.arrow
            return fetch()
        finally:
            con.close()
