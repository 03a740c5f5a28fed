"""Where the CPU seconds of a whole-process `tracekit parse FILE --out STORE -q -j 1` go (issue 28).

    python benchmarks/parse_phases.py FILE [--repeat N]

Each run is a fresh process (bytecode cached, as parse_bench runs it: process_bench.installed_env) that runs the
command as `python -m tracekit` does (tracekit.cli.main.main: the same imports, typer, exit path), after
wrapping, for timing only: the import of the CLI and of the parser's modules (done here before the command,
as the command would do them first thing), the typer command line (click parsing and typer's pydantic
coercion of each parameter, up to the parse starting), and within the parse: the native scan of each ~1 MB chunk
of events (parse/native.py, with msgspec's decode of its metadata and instant events) and `_add_native` (its
columns to column pieces); for chunks the scanner refuses (or all, with TRACEKIT_NATIVE=0), msgspec's decode with
its row capture and `_add_rows` (the chunk's rows to column pieces); the rest of the
chunk loop (reading, cutting at event boundaries, freeing the decoded events), `tables_from_columns`,
`derived_tables` (ops, kernel_summary; a merged multi-rank file's are made while its store is written), writing
the store's Parquet files and the rest of `parse_run`.
"exit and the rest" is the process's total CPU (measured by this parent, RUSAGE_CHILDREN) minus the phases.
Printed: each phase's CPU seconds, lowest of the runs (the box's noise only adds), and the total's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("interpreter start", "import tracekit.cli + typer", "import parser (numpy, pyarrow, msgspec, tracekit)",
          "typer command line (pydantic coercion)", "native scan (C, with M/i events)", "_add_native (columns)",
          "decode (msgspec + row capture)", "_add_rows (columns)", "read, cut, free events", "tables_from_columns", "derived_tables", "store writing", "rest of parse_run",
          "exit and the rest")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _worker(path: str, out_json: str, store: str) -> None:
    start = _cpu()  # the interpreter's own start-up is already in it
    acc = dict.fromkeys(PHASES, 0.0)
    acc["interpreter start"] = start
    sys.argv = ["tracekit", "parse", path, "--out", store, "-q", "-j", "1"]
    from tracekit.process_env import apply_defaults

    apply_defaults()  # before numpy / pyarrow load, as main() does (it repeats it: a no-op)
    c = _cpu()
    import tracekit.cli.main as cli_main
    import tracekit.cli.parse  # noqa: F401

    acc["import tracekit.cli + typer"] = _cpu() - c
    c = _cpu()
    import tracekit.parse.kineto as K
    import tracekit.parse.pool as P
    import tracekit.parse.run as R
    from tracekit.engines.options import engine_from_options  # noqa: F401
    from tracekit.parse import decode as D

    acc["import parser (numpy, pyarrow, msgspec, tracekit)"] = _cpu() - c
    marks: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            c0 = _cpu()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[name] += _cpu() - c0
        return wrapper

    class TimedDecoder:
        def __init__(self, decoder):
            self.decode = timed("decode (msgspec + row capture)", decoder.decode)

    capture = D.row_capture()
    capture.decoder = TimedDecoder(capture.decoder)
    K._add_rows = timed("_add_rows (columns)", K._add_rows)
    import tracekit.parse.native as N

    N.scan = timed("native scan (C, with M/i events)", N.scan)
    K._add_native = timed("_add_native (columns)", K._add_native)
    P.derived_tables = timed("derived_tables", P.derived_tables)
    R._write_kineto_tables = timed("store writing", R._write_kineto_tables)
    import tracekit.parse.merged_ranks as merged
    import tracekit.parse.split as split

    loop, tables = timed("chunk loop", K.decode_columns), timed("tables_from_columns", K.tables_from_columns)
    K.decode_columns = split.decode_columns = merged.decode_columns = loop  # where each path calls it from
    K.tables_from_columns = merged.tables_from_columns = tables  # a merged multi-rank file's ranks: merged_ranks
    parse_run = R.parse_run

    def run_parse(*args, **kwargs):
        marks["parse start"] = _cpu()
        try:
            return parse_run(*args, **kwargs)
        finally:
            marks["parse end"] = _cpu()
            total_parse = marks["parse end"] - marks["parse start"]
            chunk_loop = acc.pop("chunk loop", 0.0)
            acc["read, cut, free events"] = chunk_loop - sum(acc[k] for k in PHASES[4:8])
            inner = sum(acc[k] for k in PHASES[4:12])
            acc["rest of parse_run"] = total_parse - inner
            acc["typer command line (pydantic coercion)"] = marks["parse start"] - marks["app start"]
            Path(out_json).write_text(json.dumps(acc))

    R.parse_run = run_parse
    acc["chunk loop"] = 0.0
    marks["app start"] = _cpu()
    cli_main.main()


def measure(path: Path, env: dict[str, str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="tk_phases_") as d:
        out = Path(d) / "phases.json"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--worker", str(path), str(out), str(Path(d) / "store")], check=True, cwd=str(REPO), env=env)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        acc = json.loads(out.read_text())
    acc["exit and the rest"] = total - sum(acc.values())
    acc["total"], acc["wall"] = total, wall
    return acc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path, nargs="?")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "tracekit_bench")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(*args.worker)
        return 0
    sys.path.insert(0, str(REPO))
    from benchmarks.parse_bench import MB, _json_size
    from benchmarks.process_bench import installed_env

    env = installed_env(REPO, args.data_dir / "pycache")
    runs = [measure(args.file, env) for _ in range(max(1, args.repeat))]
    size = _json_size(args.file) / MB
    print(f"{args.file} ({size:.1f} MB of JSON): CPU seconds per phase, lowest of {len(runs)} runs "
          f"(each run's own in brackets)")
    for k in (*PHASES, "total"):
        vals = [r[k] for r in runs]
        print(f"  {k:52s} {min(vals):6.3f}  [{' '.join(f'{v:.3f}' for v in vals)}]")
    best = min(runs, key=lambda r: r["total"])
    print(f"  whole process: {size / best['total']:.1f} MB/s per CPU second, {size / best['wall']:.1f} MB/s wall "
          f"(the run with the lowest total CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
