"""Critical path + what-if replay at scale (issue 14).

1. Synthetic: R ranks × N ops per step (each rank a chain of kernels, a collective over all ranks every
   `--every` ops): the level-wise vectorised replay (tracekit.whatif.graph.replay) vs a plain per-node
   longest-path loop over the same arrays (the baseline, timed on the same graph in the same run).
2. Simulated 1,024-rank 5-D run (tracekit.simulate, pp × dp × cp × tp with ep over dp × cp): traces
   written and parsed first (not timed), then graph build + unchanged replay + critical path + one
   what-if replay per fix kind, timed; target < 60 s on 2 cores.

    python benchmarks/critical_path_bench.py [--ranks 1024 --ops 10000] [--sim] [--sim-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracekit.whatif.graph import StepGraph, critical_path, replay  # noqa: E402


def synthetic(ranks: int, ops: int, every: int, seed: int = 0) -> StepGraph:
    rng = np.random.default_rng(seed)
    n = ranks * ops
    dur = rng.integers(1_000, 50_000, n).astype(np.int64)
    rank = np.repeat(np.arange(ranks, dtype=np.int32), ops)
    idx = np.arange(n, dtype=np.int64)
    lane_src = idx[:-1][rank[:-1] == rank[1:]]
    # every `every` ops, a collective: op k of every rank waits for op k-1 of all ranks (via a sync node)
    ks = np.arange(every, ops, every)
    sync = n + np.arange(ks.size, dtype=np.int64)
    src = [lane_src, (np.arange(ranks)[:, None] * ops + ks[None, :] - 1).ravel(), np.repeat(sync, ranks)]
    dst = [lane_src + 1, np.tile(sync, ranks), (np.arange(ranks)[None, :] * ops + ks[:, None]).ravel()]
    total = n + ks.size
    start = np.zeros(total, np.int64)
    g = StepGraph(rank=np.r_[rank, np.full(ks.size, -1, np.int32)], lane=np.r_[rank.astype(np.int64), np.full(ks.size, -1)],
                  category=np.zeros(total, np.int8), start=start, dur=np.r_[dur, np.zeros(ks.size, np.int64)],
                  src=np.concatenate(src), dst=np.concatenate(dst))
    g.start = replay(g, gap=np.zeros(total, np.int64))  # measured times = a consistent schedule (gaps 0)
    g._plan = None
    return g


def loop_replay(g: StepGraph, limit_nodes: int) -> float:
    """Seconds per node of a plain Python longest-path loop (topological order from the plan)."""
    plan = g.plan
    end = g.start + g.dur
    start = g.start.copy()
    ptr, src = plan.in_ptr, plan.in_src
    order = plan.order[:limit_nodes].tolist()
    t = time.perf_counter()
    for v in order:
        a, b = ptr[v], ptr[v + 1]
        if a < b:
            start[v] = max(end[u] for u in src[a:b].tolist())
            end[v] = start[v] + g.dur[v]
    return (time.perf_counter() - t) / max(len(order), 1)


def bench_synthetic(ranks: int, ops: int, every: int) -> None:
    t = time.perf_counter()
    g = synthetic(ranks, ops, every)
    t_build = time.perf_counter() - t
    g._plan = None
    t = time.perf_counter()
    _ = g.plan
    t_plan = time.perf_counter() - t
    t = time.perf_counter()
    start = replay(g, g.dur // 2)
    t_replay = time.perf_counter() - t
    t = time.perf_counter()
    last = int(np.argmax(start + g.dur // 2))
    path = critical_path(g, start, g.dur // 2, last)
    t_path = time.perf_counter() - t
    per_node = loop_replay(g, 200_000)
    print(f"synthetic {ranks} ranks x {ops} ops ({g.num_nodes:,} nodes, {len(g.src):,} edges, "
          f"{len(g.plan.level_bounds) - 1:,} levels): build {t_build:.1f} s, plan (levels) {t_plan:.1f} s, "
          f"replay {t_replay:.1f} s, critical path {t_path:.2f} s ({path.size:,} nodes); per-node loop baseline "
          f"{per_node * g.num_nodes:.1f} s (extrapolated from 200k nodes) = {per_node * g.num_nodes / t_replay:.1f}x "
          "the vectorised replay", flush=True)


def bench_sim(sim_dir: Path | None) -> None:
    from tracekit.whatif.steps import replay_steps, run_layout, step_input
    from tracekit.parse.run import parse_run
    from tracekit.simulate import ClusterSpec, Faults, ParallelLayout, ModelSpec, simulate, write_traces
    from tracekit.tables.store import RunStore
    from tracekit.assess.whatif import prepare
    from tracekit.whatif.fixes import Fix
    from tracekit.whatif.replay import path_of, predict_ns

    root = sim_dir or Path(tempfile.mkdtemp(prefix="cp_bench_"))
    store_dir = root / "store"
    if not (store_dir / "meta.json").is_file():
        t = time.perf_counter()
        layout = ParallelLayout(pp=4, dp=16, cp=2, tp=8, ep=4, microbatches=8)
        res = simulate(ModelSpec.preset("tiny-moe"), ClusterSpec.preset("128x8-h100"), layout,
                       Faults(slow_gpu={5: 2.0}), steps=2, without=False)
        write_traces(res, root / "traces", workers=2)
        print(f"simulated + wrote {res.ranks} ranks in {time.perf_counter() - t:.0f} s (not timed below)", flush=True)
        t = time.perf_counter()
        parse_run(root / "traces", store_dir, workers=2, progress=False)
        print(f"parsed in {time.perf_counter() - t:.0f} s (not timed below)", flush=True)
    store = RunStore(store_dir)
    t0 = time.perf_counter()
    inputs = prepare(store)
    t1 = time.perf_counter()
    results = replay_steps(store, step_input(store, inputs.layout, inputs.matching))
    t2 = time.perf_counter()
    paths = [path_of(r) for r in results]
    t3 = time.perf_counter()
    lay = run_layout(inputs.layout, inputs.pipeline)
    fixes = [[Fix("rank_compute", rank=5)], [Fix("dim_overlap", dim="tp")], [Fix("stage_resplit")],
             [Fix("expert_even")], [Fix("host_stalls")], [Fix("dim_bandwidth", dim="dp", value=100.0)]]
    preds = [predict_ns(results[-1], f, lay) for f in fixes]
    t4 = time.perf_counter()
    g = results[0].graph
    print(f"1,024-rank run: {g.num_nodes:,} nodes, {len(g.src):,} edges over {len(results)} steps; "
          f"matching/layout {t1 - t0:.1f} s, graph build + unchanged replay {t2 - t1:.1f} s, critical paths "
          f"{t3 - t2:.1f} s ({[p.size for p, _ in paths]} nodes), {len(fixes)} what-if replays {t4 - t3:.1f} s; "
          f"critical path + replay total {t4 - t1:.1f} s (target < 60 s); measured "
          f"{[round(r.measured_ns / 1e6, 2) for r in results]} ms, unchanged "
          f"{[round(r.replayed_ns / 1e6, 2) for r in results]} ms, what-ifs {[round(p / 1e6, 2) for p in preds]} ms",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--sim", action="store_true", help="also the simulated 1,024-rank 5-D run")
    ap.add_argument("--sim-dir", type=Path, default=None, help="reuse (or create) the simulated run here")
    ap.add_argument("--no-synthetic", action="store_true")
    opts = ap.parse_args()
    if not opts.no_synthetic:
        bench_synthetic(opts.ranks, opts.ops, opts.every)
    if opts.sim:
        bench_sim(opts.sim_dir)


if __name__ == "__main__":
    main()
