"""`load_p2p` (read column-wise since issue 28) gives, per rank, the ops its docstring describes, computed here
row by row from plain dicts: the trace's rows (source kineto) when the rank has any, their missing peers
taken in issue order from the longest log's rows of the same (step, op) when both list as many, else the
log's rows; rows without a peer, to the rank itself or without a time dropped; sorted by start, ties in row
order."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tracekit.derive.pipeline_graph import load_p2p

COLS = ["rank", "source", "op", "peer", "ts", "dur", "enqueue_ts", "enqueue_dur", "step"]


class _Store:
    def __init__(self, rows: list[dict]):
        t = pa.Table.from_pylist(rows, schema=pa.schema([
            ("rank", pa.int32()), ("source", pa.string()), ("op", pa.string()), ("peer", pa.int32()),
            ("ts", pa.int64()), ("dur", pa.int64()), ("enqueue_ts", pa.int64()), ("enqueue_dur", pa.int64()),
            ("step", pa.int32())]))
        self.t = t.set_column(2, "op", t["op"].dictionary_encode()).set_column(1, "source", t["source"].dictionary_encode())

    def table(self, name: str, cols: list[str]) -> pa.Table:
        assert name == "collectives"
        return self.t.select(cols)


def _rows(rng: np.random.Generator) -> list[dict]:
    rows = []
    for rank in range(6):
        for source in (["kineto"] if rank % 3 else []) + (["comms_log"] if rank != 1 else []) + ([None] if rank == 5 else []):
            for i in range(int(rng.integers(3, 12))):
                ts = int(rng.integers(0, 5)) * 1_000 if rng.random() > 0.15 else None  # ties and missing times
                rows.append({"rank": rank, "source": source, "op": ["send", "recv", "all_reduce"][i % 3],
                             "peer": None if rng.random() < 0.2 else int(rng.integers(0, 6)), "ts": ts,
                             "dur": None if rng.random() < 0.1 else int(rng.integers(-5, 900)),
                             "enqueue_ts": None if rng.random() < 0.2 else int(rng.integers(0, 5000)),
                             "enqueue_dur": int(rng.integers(0, 50)), "step": int(rng.integers(0, 2))})
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]


def _expected(rows: list[dict]) -> dict[int, list[tuple]]:
    p2p = [dict(r) for r in rows if r["op"] in ("send", "recv")]
    out = {}
    for rank in sorted({r["rank"] for r in p2p}):
        mine = [r for r in p2p if r["rank"] == rank and (r["source"] or "kineto") == "kineto"]
        by_source: dict[str, list[dict]] = {}
        for r in p2p:
            if r["rank"] == rank and (r["source"] or "kineto") != "kineto":
                by_source.setdefault(r["source"], []).append(r)
        logs = list(by_source.values())
        log = max(logs, key=len) if logs else []
        if not mine:
            mine, log = log, []
        issue = lambda r: r["enqueue_ts"] if r["enqueue_ts"] is not None else (r["ts"] or 0)  # noqa: E731
        for key in {(r["step"], r["op"]) for r in mine}:
            a = sorted((r for r in mine if (r["step"], r["op"]) == key), key=issue)
            b = sorted((r for r in log if (r["step"], r["op"]) == key), key=issue)
            if log and len(a) == len(b):
                for x, y in zip(a, b):
                    if x["peer"] is None:
                        x["peer"] = y["peer"]
        ops = []
        for r in mine:
            start = r["ts"] if r["ts"] is not None else r["enqueue_ts"]
            if r["peer"] is None or r["peer"] == rank or start is None:
                continue
            dur = r["dur"] if r["ts"] is not None else r["enqueue_dur"]
            ops.append((rank, r["op"], r["peer"], start, start + max(dur or 0, 0), r["step"]))
        out[rank] = sorted(ops, key=lambda o: o[3])
    return out


def test_load_p2p_equals_the_row_by_row_rule():
    for seed in range(20):
        rows = _rows(np.random.default_rng(seed))
        got = load_p2p(_Store(rows))
        want = _expected(rows)
        assert list(got) == list(want)
        assert {r: [(o.rank, o.op, o.peer, o.start, o.end, o.step) for o in ops] for r, ops in got.items()} == want
