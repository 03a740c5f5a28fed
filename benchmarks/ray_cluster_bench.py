"""`tracekit analyze --engine ray --address auto` on a three-node Ray cluster started with `ray start`
beside the local engine, and `--max-memory` budgets, on one run of many ranks.

    python benchmarks/ray_cluster_bench.py [--ranks 1024] [--source real|sim] [--nodes 3] [--budgets 1GB,512MB]
        [--workers 2] [--concurrent] [--data-dir /tmp/tracekit-ray] [--json OUT]

The run: `--source real` (default) is scale_bench's real-derived run (copies of a real multi-rank
NCCL trace with distinct ranks and shifted clocks, `ensure_real_run`); `sim` its simulated 5-D run.
The cluster (benchmarks/ray_cluster.py): a head and nodes-1 worker nodes, each its own `ray start`
with 1 CPU, its own resource `nodeN`, ports, object store; the files on this machine's disk are
their shared storage. Cases, each a fresh `tracekit analyze` process (nice'd), measured for wall,
CPU (the process tree's, sampled every 0.5 s), the peak summed PSS of the process tree and of the driver
alone (PSS sampled every second):
- ray: `--engine ray --address auto` with RAY_ADDRESS naming the cluster; the tasks each node ran
  (tracekit's `ray tasks by node:` line) and the cluster's own peak PSS (its raylets, workers, GCS)
  are printed: proof that every node worked;
- local: `-j W` (the process pool);
- budget B for each of --budgets: `-j W --max-memory B`, with whether the tree's peak stayed within B
  and what the command said about it.
Every case's tables (every table of the store) and analysis (findings and the whole document, less
the command line) are compared with the local case's. With --concurrent the cases run at the same
time (for a busy shared machine: wall and CPU are then under each other's load, the peaks are each
case's own tree).
The reduce step is bounded: the driver takes results in submission order with at most 2 tasks per CPU
in flight and writes each rank to the store before taking the next, so its peak is the cross-rank
analysis plus a few ranks, never every rank's tables (compare the ray driver's peak with the local tree's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.ray_cluster import RayCluster, node_of_tasks  # noqa: E402
from benchmarks.scale_bench import _TICK, _cpu_ticks, _pss_kb, _tree, ensure_real_run, ensure_sim_run  # noqa: E402

MB = 1_000_000
PLAIN = {"TRACEKIT_STRICT_DOCUMENT": "0"}


def measured(cmd: list[str], env: dict[str, str], extra_pids=None) -> dict:
    """Run cmd: wall, CPU of its tree, peak summed PSS of its tree and of its root alone, stderr's tail;
    with `extra_pids` (a callable) also the peak summed PSS of those processes (a Ray cluster)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    peak = {"tree": 0, "driver": 0, "cluster": 0}
    cpu: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:  # cheap: the box is shared, and this runs beside the measured command
        n, extra = 0, []
        while not done.is_set():
            pids = _tree(proc.pid)
            for p in pids:
                t = _cpu_ticks(p)
                if t is not None:
                    cpu[p] = max(cpu.get(p, 0), t)
            if n % 2 == 0:  # PSS every second (smaps_rollup walks the page tables)
                vals = {p: _pss_kb(p).get("Pss", 0) for p in pids}
                peak["tree"] = max(peak["tree"], sum(vals.values()))
                peak["driver"] = max(peak["driver"], vals.get(proc.pid, 0))
                if extra_pids is not None:
                    if n % 30 == 0:  # the cluster's processes (a /proc scan) every 15 s
                        extra = extra_pids()
                    peak["cluster"] = max(peak["cluster"], sum(_pss_kb(p).get("Pss", 0) for p in extra))
            n += 1
            done.wait(0.5)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, err = proc.communicate()
    done.set()
    th.join()
    row = {"rc": proc.returncode, "wall_s": round(time.perf_counter() - t0, 1),
           "cpu_s": round(sum(cpu.values()) / _TICK, 1), "load_avg_1m": round(os.getloadavg()[0], 1),
           "peak_pss_mb": round(peak["tree"] * 1024 / MB, 1), "driver_peak_pss_mb": round(peak["driver"] * 1024 / MB, 1),
           "stderr_tail": err[-3000:]}
    if extra_pids is not None:
        row["cluster_peak_pss_mb"] = round(peak["cluster"] * 1024 / MB, 1)
    return row


def plain(t):
    import pyarrow as pa

    cols = [c.cast(pa.string()) if pa.types.is_dictionary(c.type) else c for c in t.columns]
    return pa.table(dict(zip(t.column_names, cols))).combine_chunks()


def store_differences(a_dir: Path, b_dir: Path) -> list[str]:
    """Tables (every one of either store) and columns that differ; [] when the stores are equal."""
    from tracekit.tables.store import RunStore

    a, b = RunStore(a_dir), RunStore(b_dir)
    names = sorted({p.stem for p in a_dir.glob("*.parquet")} | {p.stem for p in b_dir.glob("*.parquet")})
    diffs = []
    for name in names:
        try:
            x, y = plain(a.table(name)), plain(b.table(name))
        except Exception as exc:  # a table one store lacks
            diffs.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if x.num_rows != y.num_rows or x.column_names != y.column_names:
            diffs.append(f"{name}: {x.num_rows} vs {y.num_rows} rows")
            continue
        bad = [c for c in x.column_names if not x.column(c).equals(y.column(c))]
        if bad:
            diffs.append(f"{name}: columns {bad}")
    return diffs or ([] if names else ["no tables"])


def analysis_differences(a_out: Path, b_out: Path) -> dict:
    x = json.loads((a_out / "analysis.json").read_text())
    y = json.loads((b_out / "analysis.json").read_text())
    for d in (x, y):
        d.pop("command", None)
    return {"findings_equal": x["findings"] == y["findings"], "findings": len(y["findings"]),
            "document_equal": x == y, "keys_differing": sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--source", choices=("real", "sim"), default="real")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="local engine processes (-j)")
    ap.add_argument("--budgets", default="1GB,512MB", help="--max-memory cases ('' for none)")
    ap.add_argument("--concurrent", action="store_true", help="run the cases at the same time")
    ap.add_argument("--data-dir", default="/tmp/tracekit-ray")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    data = Path(a.data_dir)
    work = data / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run, stats = ensure_real_run(data, a.ranks) if a.source == "real" else ensure_sim_run(data, a.ranks)
    env = {**os.environ, **PLAIN, "PYTHONPATH": str(REPO)}
    tk = ["nice", sys.executable, "-m", "tracekit", "analyze", str(run)]
    budgets = [b for b in a.budgets.split(",") if b]
    results: dict = {"ranks": a.ranks, "source": a.source, "json_mb": round(stats["json_bytes"] / MB, 1),
                     "nodes": a.nodes, "workers": a.workers, "concurrent": a.concurrent, "cases": {}}

    cluster = RayCluster(nodes=a.nodes, cpus_per_node=1)
    t0 = time.perf_counter()
    try:
        cluster.start()
        results["cluster"] = {"address": cluster.address, "start_s": round(time.perf_counter() - t0, 1),
                              "log": cluster.log}
        print(f"cluster of {a.nodes} nodes at {cluster.address} started in {results['cluster']['start_s']} s "
              f"({'; '.join(cluster.log)})", flush=True)
        cases = {"ray": (tk + ["--out", str(work / "ray"), "--engine", "ray", "--address", "auto"],
                         cluster.env(env), cluster.pids),
                 "local": (tk + ["--out", str(work / "local"), "-j", str(a.workers), "-q"], env, None)}
        for b in budgets:
            cases[f"max_memory_{b}"] = (tk + ["--out", str(work / f"mm_{b}"), "-j", str(a.workers),
                                              "--max-memory", b], env, None)

        def go(name: str) -> tuple[str, dict]:
            cmd, e, extra = cases[name]
            row = measured(cmd, e, extra)
            print(f"  {name}: rc {row['rc']} wall {row['wall_s']} s cpu {row['cpu_s']} s peak PSS {row['peak_pss_mb']} MB "
                  f"(driver {row['driver_peak_pss_mb']} MB)", flush=True)
            return name, row

        if a.concurrent:
            with ThreadPoolExecutor(len(cases)) as pool:
                for name, row in pool.map(go, list(cases)):
                    results["cases"][name] = row
        else:
            for name in cases:
                results["cases"][name] = go(name)[1]
    finally:
        n = cluster.stop()
        print(f"cluster stopped ({n} processes)", flush=True)

    local = work / "local"
    for name, row in results["cases"].items():
        row["tasks_by_node"] = dict(node_of_tasks(row["stderr_tail"])) if name == "ray" else None
        if name.startswith("max_memory_"):
            budget = name.removeprefix("max_memory_")
            from tracekit.engines.options import parse_memory_size

            row["budget_mb"] = round(parse_memory_size(budget) / MB, 1)
            row["within_budget"] = row["peak_pss_mb"] <= row["budget_mb"]
            row["said"] = [ln for ln in row["stderr_tail"].splitlines() if "max-memory" in ln]
        if name != "local" and row["rc"] == 0 and results["cases"]["local"]["rc"] == 0:
            out = work / ("ray" if name == "ray" else f"mm_{name.removeprefix('max_memory_')}")
            row["table_differences"] = store_differences(local / "tables", out / "tables")
            row.update(analysis_differences(local, out))
    show(results)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    ok = all(r["rc"] == 0 and not r.get("table_differences") and r.get("findings_equal", True)
             for r in results["cases"].values())
    return 0 if ok else 1


def show(results: dict) -> None:
    print(f"\n{results['source']} {results['ranks']} ranks ({results['json_mb']} MB JSON), "
          f"{'concurrent' if results['concurrent'] else 'one at a time'}:")
    print(f"  {'case':<20} {'rc':>3} {'wall s':>8} {'cpu s':>8} {'tree PSS MB':>11} {'driver MB':>10} "
          f"{'tables':>7} {'findings':>9} {'document':>9}")
    for name, r in results["cases"].items():
        tables = "-" if "table_differences" not in r else ("equal" if not r["table_differences"] else "DIFFER")
        print(f"  {name:<20} {r['rc']:>3} {r['wall_s']:>8} {r['cpu_s']:>8} {r['peak_pss_mb']:>11} "
              f"{r['driver_peak_pss_mb']:>10} {tables:>7} {str(r.get('findings_equal', '-')):>9} "
              f"{str(r.get('document_equal', '-')):>9}")
        if r.get("table_differences"):
            print(f"    tables differing: {r['table_differences']}")
        if r.get("keys_differing"):
            print(f"    analysis keys differing: {r['keys_differing']}")
        if r.get("tasks_by_node") is not None:
            print(f"    tasks by node: {r['tasks_by_node']}; cluster's own peak PSS {r.get('cluster_peak_pss_mb')} MB")
        if "budget_mb" in r:
            print(f"    budget {r['budget_mb']} MB: within {r['within_budget']}; tracekit said: {r['said']}")
        if r["rc"] != 0:
            print(f"    stderr: {r['stderr_tail'][-1500:]}")


if __name__ == "__main__":
    sys.exit(main())
