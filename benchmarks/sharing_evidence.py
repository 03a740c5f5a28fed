"""What the user-script matrix's recordings say about the processor-sharing model (whatif/sharing.py; issue 32).

Per run of each scenario recorded by `benchmarks/user_scripts_matrix.py --out DIR` (and analysed there: the
`*_out/tables` stores), one line:

- per rank its recorded CPU time and run-queue wait per profiled step (the manifest's `cpu_window`, plain json)
  and its CPU time relative to the same rank's mean over the clean runs ("pace": the same rank's work taking more
  CPU time in one run than in another);
- the time per step with 2, 1 and 0 of the job's ranks runnable in the trace (the model's runnable intervals:
  work nodes and short gaps) and the ranks' CPU time per step two ways of sharing the cores would give beside
  `--outside` always-runnable threads (the harness's busy process: 1): "fair", the cores split evenly among
  the runnable threads (Σ_c T_c · c · min(1, K / (c + outside))), and "held", the outside threads keep their
  cores and the ranks share the rest (Σ_c T_c · min(c, K − outside));
- the model's fitted outside load E_r per rank (`HostShare.load`);
- "paired pace": per rank, its compute ops of at least 0.5 ms that ran while the other ranks were runnable
  throughout (keyed by the op's position in its step), each key's median over the run against the median of
  the same key over the clean runs, weighted by the run's op count (the same ops at the same concurrency:
  a ratio above the clean runs' own is a slower pace the trace cannot attribute to concurrency); "alone
  pace" likewise for its ops run while no other rank was runnable;
- for a faulty run, its top finding's replayed step (analysis.json) beside the clean runs' mean step (the
  harness's `step_ns`) and that mean scaled by the run's pace of its rank 0.

Pace and paired pace compare like with like only for a rank whose work the fault leaves alone (rank 0 of the
DDP, FSDP2 and DataLoader jobs; not the MoE job's ranks, whose routed tokens the fault moves, nor the pipeline's
stages, whose ops sleep: the phases count each rank by its runnable share, so c is not a whole number there).

    python benchmarks/sharing_evidence.py --out DIR [--only NAME ...] [--runs 3] [--outside 1]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.user_scripts_matrix import SCENARIOS, step_ns  # noqa: E402
from tracekit.assess.whatif import prepare  # noqa: E402
from tracekit.derive import intervals as iv  # noqa: E402
from tracekit.tables.store import RunStore  # noqa: E402
from tracekit.whatif.graph import Category  # noqa: E402
from tracekit.whatif.sharing import _concurrency, _intervals, host_shares  # noqa: E402
from tracekit.whatif.steps import replay_steps, run_layout, step_input  # noqa: E402

MIN_OP_NS = 500_000
"""paired pace: ops at least this long (a shorter op runs within one scheduler slice or not at all)"""


def cpu_per_step(traces: Path) -> dict[int, tuple[float, float]]:
    """rank -> (CPU ms, run-queue wait ms) per profiled step, from the manifest's CPU windows."""
    ranks = json.loads((traces / "manifest.json").read_text()).get("ranks") or []
    out = {}
    for r in ranks:
        w, n = r.get("cpu_window"), len(r.get("profiled_steps") or []) or 1
        if w:
            out[int(r["rank"])] = (w["cpu_ns"] / n / 1e6, w["wait_ns"] / n / 1e6)
    return out


def model(out: Path):
    """(graph, the host's processor-sharing model, cores) of an analysed run; None without the model."""
    store = RunStore(out / "tables")
    inputs = prepare(store)
    g = replay_steps(store, step_input(store, inputs.layout, inputs.matching))[0].graph
    shares = host_shares(g, run_layout(inputs.layout, inputs.pipeline, store))
    return (g, shares[0], shares[0].cores) if len(shares) == 1 else None


def phases(g, s) -> tuple[np.ndarray, np.ndarray]:
    """(runnable ranks c, ms per step with c runnable) of the trace, each rank counted by its runnable share."""
    rk, a, b = _intervals(g, s.nodes, s.gaps, g.start, g.dur, g.gap)
    bp, c = _concurrency(rk, a, b, s.share)
    steps = int((g.ranks == g.ranks[0]).sum())
    return c, np.diff(bp) / steps / 1e6


def shared_cpu(c: np.ndarray, ms: np.ndarray, cores: int, outside: float) -> tuple[float, float]:
    """The ranks' CPU ms per step (fair, held) for `ms` spent with `c` ranks runnable (module docstring)."""
    fair = (ms * c * np.minimum(1.0, cores / np.maximum(c + outside, 1e-9))).sum()
    held = (ms * np.minimum(c, max(cores - outside, 0.0))).sum()
    return float(fair), float(held)


def ops_by_position(g, s, rank: int, paired: bool) -> dict[tuple[int, str], list[int]]:
    """(position in its step, name) -> durations of `rank`'s compute ops at least `MIN_OP_NS` long that ran
    while every other rank of the host was runnable throughout (`paired`: ≥ 95 % of the op) or while none
    was (≤ 5 %)."""
    rk, a, b = _intervals(g, s.nodes, s.gaps, g.start, g.dur, g.gap)
    others = [iv.union(a[rk == r], b[rk == r]) for r in np.unique(rk).tolist() if r != rank]
    mine = s.nodes[(g.rank[s.nodes] == rank) & (g.category[s.nodes] == int(Category.COMPUTE))]
    out = collections.defaultdict(list)
    for st in np.unique(g.step[mine]).tolist():
        ops = mine[g.step[mine] == st]
        for k, n in enumerate(ops[np.argsort(g.start[ops], kind="stable")].tolist()):
            x0, x1 = int(g.start[n]), int(g.start[n] + g.dur[n])
            each = [np.clip(np.minimum(u1, x1) - np.maximum(u0, x0), 0, None).sum() for u0, u1 in others] or [0]
            if g.dur[n] >= MIN_OP_NS and (min(each) >= 0.95 * g.dur[n] if paired else max(each) <= 0.05 * g.dur[n]):
                out[(k, g.name[n])].append(int(g.dur[n]))
    return out


def pace_of(run: dict, clean: dict) -> float:
    """A run's ops against the clean runs' (`ops_by_position` of each): Σ n·median(run) / Σ n·median(clean)."""
    keys = [k for k in run if len(clean.get(k, ())) >= 3]
    num = sum(len(run[k]) * float(np.median(run[k])) for k in keys)
    den = sum(len(run[k]) * float(np.median(clean[k])) for k in keys)
    return num / den if den else float("nan")


def top_replayed_step(out: Path) -> float | None:
    findings = json.loads((out / "analysis.json").read_text())["findings"]
    loud = [f for f in findings if f["severity"] in ("warning", "critical")]
    step = (loud[0].get("evidence") or {}).get("replayed_step_ns") if loud else None
    return None if step is None else step / 1e6


def scenario(root: Path, name: str, runs: int, outside: float) -> list[str]:
    names = [f"{kind}{i}" for kind in ("clean", "faulty") for i in range(runs)]
    cpu = {n: cpu_per_step(root / f"{name}_{n}") for n in names}
    built = {n: model(root / f"{name}_{n}_out") for n in names}
    if any(v is None for v in built.values()):
        return [f"{name}: no processor-sharing model on some run (not one host with its CPU windows)"]
    ranks = sorted(cpu[names[0]])
    clean_cpu = {r: float(np.mean([cpu[f"clean{i}"][r][0] for i in range(runs)])) for r in ranks}
    ops = {n: {(r, p): ops_by_position(g, s, r, p) for r in ranks for p in (True, False)}
           for n, (g, s, _) in built.items()}
    pooled = {key: collections.defaultdict(list) for key in ops[names[0]]}
    for i in range(runs):
        for key, by_pos in ops[f"clean{i}"].items():
            for k, v in by_pos.items():
                pooled[key][k].extend(v)
    clean_step = float(np.mean([step_ns(root / f"{name}_clean{i}") for i in range(runs)])) / 1e6
    lines = [f"{name}: clean mean step {clean_step:.1f} ms"]
    for n, (g, s, cores) in built.items():
        c, ms = phases(g, s)
        fair, held = shared_cpu(c, ms, cores, outside)
        t = {k: float(ms[np.rint(c) == k].sum()) for k in (2, 1, 0)}
        ranks_txt = "; ".join(
            f"r{r} CPU {cpu[n][r][0]:.1f} (pace {cpu[n][r][0] / clean_cpu[r]:.2f}) wait {cpu[n][r][1]:.1f} "
            f"E {s.load[r]:.2f} paired pace {pace_of(ops[n][r, True], pooled[r, True]):.2f} "
            f"alone pace {pace_of(ops[n][r, False], pooled[r, False]):.2f}" for r in ranks)
        line = (f"  {n}: {ranks_txt} | T2/T1/T0 {t[2]:.1f}/{t[1]:.1f}/{t[0]:.1f} ms; ranks' CPU "
                f"{sum(v[0] for v in cpu[n].values()):.1f}, fair {fair:.1f}, held {held:.1f}")
        replayed = top_replayed_step(root / f"{name}_{n}_out") if n.startswith("faulty") else None
        if replayed is not None:
            p = cpu[n][ranks[0]][0] / clean_cpu[ranks[0]]
            line += (f" | step {step_ns(root / f'{name}_{n}') / 1e6:.1f}, replayed fixed {replayed:.1f}, "
                     f"clean mean at rank {ranks[0]}'s pace {clean_step * p:.1f}")
        lines.append(line)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="a user_scripts_matrix.py --out directory, analysed")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--outside", type=float, default=1.0, help="always-runnable threads beside the job")
    args = ap.parse_args()
    root = Path(args.out)
    for sc in SCENARIOS:
        if (args.only and sc.name not in args.only) or (not args.only and not sc.default):
            continue
        if not (root / f"{sc.name}_clean0_out" / "tables").exists():
            continue
        print("\n".join(scenario(root, sc.name, args.runs, args.outside)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
