"""Is the data-parallel `unoverlapped_collective` what-if right? The simulator answers independently.

    python benchmarks/dp_overlap_check.py [--pp 2 --dp 4 --cp 2 --tp 4] [--slow-gpu RANK] [--out DIR]

The simulator's DDP already issues every gradient bucket (dense buckets over `dp_cp`, each MoE layer's expert
gradients over `edp`) as soon as its gradients are final (simulate/program.py `GradSync`): the simulated run IS
the overlapped layout, so a fix that only starts buckets once their gradients exist has nothing to save there.
This prints, for one simulated 5-D MoE layout (tiny-moe, ep 2, 2 x pp micro-batches, 1F1B; optionally one slow
GPU):
- the simulator's step as simulated, with smaller DDP buckets (`ParallelLayout.bucket_mb`: each bucket ready
  earlier), with each data-parallel group's transfers free (latency 0, bandwidth x1e9: an upper bound of any
  overlap of them; done here by wrapping `World.link`, for this check only), and with `no_overlap` (all buckets
  after backward);
- `tracekit analyze`'s data-parallel `unoverlapped_collective` findings on the same traces (and, with a slow
  GPU, every finding ranked above it): their replayed saving beside those.
A what-if saving above 0 where smaller buckets save 0 over-states what overlapping saves.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def simulator_steps(pp: int, dp: int, cp: int, tp: int, slow: int | None) -> dict[str, int]:
    from tracekit.simulate import ClusterSpec, Faults, ModelSpec, ParallelLayout, parse_fault
    from tracekit.simulate import program
    from tracekit.simulate.api import step_time

    model = ModelSpec.preset("tiny-moe")

    def layout(**kw):
        return ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=2, microbatches=2 * pp, **kw)

    lay = layout()
    cluster = ClusterSpec.preset(f"{max(1, -(-lay.world_size // 8))}x8-h100")
    faults = parse_fault(f"slow-gpu={slow}:1.3", Faults()) if slow is not None else Faults()
    link = program.World.link

    def free(dims):
        def free_link(self, g, op=None):
            return (0, 1e-9) if g.dim in dims else link(self, g, op)
        return free_link

    out = {"as simulated (25 MB buckets)": step_time(model, cluster, lay, faults, steps=2)}
    for mb in (5.0, 1.0):
        out[f"buckets {mb:g} MB"] = step_time(model, cluster, layout(bucket_mb=mb), faults, steps=2)
    out["no overlap (buckets after backward)"] = step_time(model, cluster, lay, parse_fault("no-overlap", faults), steps=2)
    for dims in (("dp", "dp_cp"), ("edp",), ("dp", "dp_cp", "edp")):
        program.World.link = free(dims)
        try:
            out[f"{'+'.join(dims)} transfers free"] = step_time(model, cluster, lay, faults, steps=2)
        finally:
            program.World.link = link
    return out


def analysis_whatifs(pp: int, dp: int, cp: int, tp: int, slow: int | None, work: Path) -> list[dict]:
    run, out = work / "traces", work / "out"
    cmd = [sys.executable, "-m", "tracekit", "simulate", "--pp", str(pp), "--dp", str(dp), "--cp", str(cp), "--tp",
           str(tp), "--ep", "2", "--microbatches", str(2 * pp), "--model", "tiny-moe", "--steps", "2", "--no-without",
           "--out", str(run)] + (["--fault", f"slow-gpu={slow}:1.3"] if slow is not None else [])
    subprocess.run(["nice", *cmd], check=True, capture_output=True)
    subprocess.run(["nice", sys.executable, "-m", "tracekit", "analyze", str(run), "--out", str(out), "-j", "1", "-q"],
                   check=True, capture_output=True)
    findings = json.loads((out / "analysis.json").read_text())["findings"]
    slow_at = next((i for i, f in enumerate(findings) if f["kind"] == "straggler" and f.get("ranks") == [slow]), -1)
    return [{"position": i, "kind": f["kind"], "dim": f.get("dim"), "ranks": (f.get("ranks") or [])[:4],
             "replayed_saving_ns": (f.get("evidence") or {}).get("replayed_saving_ns"),
             "whatif": (f.get("evidence") or {}).get("whatif"),
             "bytes_p50": (f.get("evidence") or {}).get("bytes_p50")}
            for i, f in enumerate(findings)
            if f["kind"] == "unoverlapped_collective" and f.get("dim") in ("dp", "fsdp", "dp_cp", "edp")
            or i <= slow_at]  # and every finding up to the slow GPU's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for dim, default in (("pp", 2), ("dp", 4), ("cp", 2), ("tp", 4)):
        ap.add_argument(f"--{dim}", type=int, default=default)
    ap.add_argument("--slow-gpu", type=int, default=None, help="a rank whose GPU runs 1.3x slower (default: none)")
    ap.add_argument("--out", default=None, help="keep the traces and the analysis here (default: a temp folder)")
    a = ap.parse_args()
    steps = simulator_steps(a.pp, a.dp, a.cp, a.tp, a.slow_gpu)
    base = steps["as simulated (25 MB buckets)"]
    print(f"simulator, pp {a.pp} dp {a.dp} cp {a.cp} tp {a.tp} ep 2, tiny-moe, slow GPU {a.slow_gpu}:")
    for name, ns in steps.items():
        print(f"  {name:<40} step {ns / 1e6:9.3f} ms   saving {(base - ns) / 1e6:8.3f} ms")
    with tempfile.TemporaryDirectory(prefix="dp-overlap-") as tmp:
        work = Path(a.out) if a.out else Path(tmp)
        rows = analysis_whatifs(a.pp, a.dp, a.cp, a.tp, a.slow_gpu, work)
    print("tracekit analyze, the same layout's traces:")
    for r in rows:
        saving = r["replayed_saving_ns"]
        print(f"  #{r['position']} {r['kind']} {r['dim']} ranks {r['ranks']}: {r['whatif']} saves "
              f"{'-' if saving is None else f'{saving / 1e6:.3f} ms'} (bucket p50 {r['bytes_p50']} B)")
    bound = base - min(steps["buckets 1 MB"], steps["buckets 5 MB"])
    dp = [r for r in rows if r["kind"] == "unoverlapped_collective" and r["dim"] in ("dp", "fsdp", "dp_cp", "edp")]
    over = [r for r in dp if (r["replayed_saving_ns"] or 0) > bound + 100_000]
    print(f"earlier buckets save {bound / 1e6:.3f} ms in the simulator; data-parallel what-ifs more than 0.1 ms "
          f"above that: {len(over)} of {len(dp)}")


if __name__ == "__main__":
    main()
