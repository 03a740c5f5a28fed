"""Native JSON readers as tracekit's event decoder? CPU seconds and exactness on one Kineto trace, same run.

    python benchmarks/json_readers.py [TRACE] [--repeat N]

Issue 28 asks for a whole-process `tracekit parse` of >= 100 MB/s per CPU second; the decode into per-event
columns is its largest part. This measures, each in a fresh process and in CPU seconds (user + sys, every
thread: a reader's threads cost CPU too), how long each candidate takes to turn the same trace's
`traceEvents` into columns:

- tracekit: `kineto.decode_columns` (msgspec, row capture, column pieces: what `tracekit parse` runs);
- duckdb-array: duckdb's `read_json(format='array')` with explicit columns (ts/dur DECIMAL(38,9), read from
  the number's text; args as a struct) over the events array written to its own file (duckdb reads a file's
  top-level array in parallel; the trace's own `{"traceEvents": [...]}` is one giant record for it);
- duckdb-chunks: `from_json` over the events cut into ~1 MB JSON arrays held in Arrow (no file written);
- polars: `polars.read_json` of the events array with a schema (skipped when polars is not installed;
  it is not a tracekit dependency).

Then it checks what each reader makes of timestamps and pids tracekit must keep exactly (integer ns from the
µs text, half away from zero; "Spans" pids), on a few events written for the purpose. TRACE defaults to
the 103 MB synthetic trace of parse_bench (built there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MB = 1_000_000
DEFAULT = Path(tempfile.gettempdir()) / "tracekit_bench" / "synthetic_100mb.json"
CANDIDATES = ("tracekit", "duckdb-array", "duckdb-chunks", "polars")
EDGE_TEXT = ('[{"ph":"X","name":"a","ts":1234567.8912345678901234,"dur":1e3,"pid":"Spans","tid":1},'
             '{"ph":"X","name":"b","ts":4458676416431.3975,"dur":1.0005,"pid":1,"tid":2},'
             '{"ph":"X","name":"c","ts":1716390922123456.789,"dur":2,"pid":1,"tid":2}]')
EXACT_NS = [(1234567891, 1000000), (4458676416431398, 1001), (1716390922123456789, 2000)]
"""EDGE_TEXT's (ts, dur) as tracekit keeps them: integer ns of the µs text, rounded half away from zero."""
ARGS = (("External id", "VARCHAR"), ("kernel", "VARCHAR"), ("device", "VARCHAR"), ("stream", "VARCHAR"),
        ("correlation", "VARCHAR"), ("Concrete Inputs", "JSON"), ("Input type", "JSON"), ("Input Strides", "JSON"),
        ("Input Dims", "JSON"), ("flops", "DOUBLE"), ("Collective name", "VARCHAR"), ("In msg nelems", "VARCHAR"),
        ("Out msg nelems", "VARCHAR"), ("Group size", "VARCHAR"), ("dtype", "VARCHAR"))
"""The `args` keys the tables read (decode.ARG_FIELDS without "external id": duckdb's struct keys are
case-insensitive, so "External id" and "external id" cannot both be columns)."""
DEC = "DECIMAL(38,9)"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _events_array(trace: Path) -> bytes:
    buf = trace.read_bytes()
    m = re.search(rb'"traceEvents"\s*:\s*\[', buf)
    return buf[m.end() - 1: buf.rfind(b"]") + 1]


def _duckdb_columns() -> str:
    args = ", ".join(f'"{k}" {t}' for k, t in ARGS).replace("'", "''")
    return (f"{{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', ts: '{DEC}', "
            f"dur: '{DEC}', args: 'STRUCT({args})'}}")


def _run(tool: str, trace: Path, work: Path) -> dict:
    """In this (fresh) process: the candidate's decode of `trace` into columns; rows and CPU seconds."""
    if tool == "tracekit":
        from tracekit.parse import kineto as K
        from tracekit.parse.gz import iter_trace_blocks

        c = _cpu()
        cols = K.decode_columns(iter_trace_blocks(str(trace), None, K.CHUNK_BYTES))
        return {"cpu": _cpu() - c, "rows": cols.n, "what": "complete events"}
    if tool.startswith("duckdb"):
        import duckdb

        con = duckdb.connect(config={"threads": 1})
        if tool == "duckdb-array":
            path = work / "events.json"
            path.write_bytes(_events_array(trace))
            c = _cpu()
            table = con.sql(f"SELECT * FROM read_json('{path}', format='array', columns={_duckdb_columns()})").arrow()
        else:
            import pyarrow as pa

            c = _cpu()
            body = _events_array(trace)[1:-1]
            pieces, pos = [], 0
            for m in re.finditer(rb"\}\s*,\s*\{", body):
                if m.start() - pos >= 1 << 20:
                    pieces.append(b"[" + body[pos:m.start() + 1] + b"]")
                    pos = m.end() - 1
            pieces.append(b"[" + body[pos:] + b"]")
            con.register("chunks", pa.table({"j": pa.array(pieces, pa.large_binary()).cast(pa.large_string())}))
            shape = [{"ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "VARCHAR", "tid": "VARCHAR",
                      "ts": DEC, "dur": DEC, "args": dict(ARGS)}]
            table = con.sql("SELECT unnest(ev, recursive := true) FROM (SELECT from_json(j, ?) AS ev FROM chunks)",
                            params=[json.dumps(shape)]).arrow()
        table = table.read_all() if hasattr(table, "read_all") else table
        return {"cpu": _cpu() - c, "rows": table.num_rows, "what": "all events"}
    import polars as pl

    path = work / "events.json"
    path.write_bytes(_events_array(trace))
    schema = {"ph": pl.String, "cat": pl.String, "name": pl.String, "pid": pl.String, "tid": pl.String,
              "ts": pl.Decimal(38, 9), "dur": pl.Decimal(38, 9),
              "args": pl.Struct({k: pl.Float64 if t == "DOUBLE" else pl.String for k, t in ARGS if t != "JSON"})}
    c = _cpu()
    df = pl.read_json(path, schema=schema)
    return {"cpu": _cpu() - c, "rows": df.height, "what": "all events"}


def _exactness(tool: str, work: Path) -> str:
    """What the candidate reads for EDGE_EVENTS' ts, dur (as ns) and pid, against tracekit's exact values."""
    path = work / "edge.json"
    path.write_text(EDGE_TEXT)
    try:
        if tool == "tracekit":
            from tracekit.parse import kineto as K

            cols = K.decode_columns([b'{"traceEvents":' + EDGE_TEXT.encode() + b"}"])
            got = list(zip(cols.ts[0].tolist(), cols.dur[0].tolist()))
            pids = [str(p) for p in cols.pid[0].tolist()]
        elif tool.startswith("duckdb"):
            import duckdb

            rows = duckdb.connect().sql(f"SELECT ts, dur, pid, ts::VARCHAR FROM read_json('{path}', format='array', "
                                        f"columns={{ts: '{DEC}', dur: '{DEC}', pid: 'VARCHAR'}})").fetchall()
            got = [(_ns(r[0]), _ns(r[1])) for r in rows]
            pids = [r[2] for r in rows]
            as_text = duckdb.connect().sql(f"SELECT ts FROM read_json('{path}', format='array', "
                                           f"columns={{ts: 'VARCHAR'}})").fetchall()
            pids.append(f"ts as VARCHAR: {[r[0] for r in as_text]}")
        else:
            import polars as pl

            df = pl.read_json(path, schema={"ts": pl.Decimal(38, 9), "dur": pl.Decimal(38, 9), "pid": pl.String})
            got = [(_ns(a), _ns(b)) for a, b in zip(df["ts"].to_list(), df["dur"].to_list())]
            pids = df["pid"].to_list()
    except Exception as exc:  # noqa: BLE001 - a reader that cannot read them is the finding
        return f"fails: {type(exc).__name__}: {str(exc)[:120]}"
    verdict = "exact" if got == EXACT_NS else f"NOT exact: {got} (want {EXACT_NS})"
    return f"{verdict}; pids {pids}"


def _ns(d) -> int | None:
    from decimal import ROUND_HALF_UP, Decimal

    return None if d is None else int((Decimal(d) * 1000).to_integral_value(rounding=ROUND_HALF_UP))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=1, help="runs per candidate (the least CPU is reported)")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        tool, trace, work = args.worker
        out = _run(tool, Path(trace), Path(work))
        out["exactness"] = _exactness(tool, Path(work))
        print(json.dumps(out))
        return 0
    if not args.trace.exists():
        sys.exit(f"{args.trace} not found (benchmarks/parse_bench.py builds it)")
    size = args.trace.stat().st_size
    env = dict(os.environ, PYTHONPATH=str(REPO))
    print(f"{args.trace} ({size / MB:.1f} MB of JSON), CPU seconds of the decode into columns (least of {args.repeat}):")
    for tool in CANDIDATES:
        best, wall = None, 0.0
        for _ in range(max(1, args.repeat)):
            with tempfile.TemporaryDirectory(prefix="tk_json_readers_") as work:
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, __file__, "--worker", tool, str(args.trace), work],
                                      capture_output=True, text=True, env=env, cwd=str(REPO))
                wall = time.perf_counter() - t
            if proc.returncode != 0:
                best = {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
                break
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            if best is None or r["cpu"] < best["cpu"]:
                best = r
        if "error" in best:
            print(f"  {tool:14s} not measured: {best['error'][:150]}")
            continue
        print(f"  {tool:14s} {best['cpu']:6.2f} CPU s ({size / MB / best['cpu']:6.1f} MB/s per CPU s), "
              f"{best['rows']:,} {best['what']}; exactness: {best['exactness']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
