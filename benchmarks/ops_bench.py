"""tracekit's op-level figures beside TraceLens's published ones and HTA's kernel breakdown, same run.

    python benchmarks/ops_bench.py [--traces DIR]

TraceLens (AMD) is not on PyPI (the PyPI `tracelens` is another project), so its figures are the ones it
produced on these shared traces (issue 29): GEMM time-weighted TFLOP/s, GEMM shapes and GEMM kernel time,
the top GEMM shape's TFLOP/s, and Qwen's op categories. HTA's kernel breakdown
(`TraceAnalysis.get_gpu_kernel_breakdown`) is measured here, beside tracekit's kernel summary.
Timings of the two tools' analysis runs are printed as a ratio measured in this run.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TRACEKIT_SHARED_TRACES") or REPO.parent / "shared" / "traces")

TRACELENS = {
    "tl_h100_qwen": {"gemm_tflops": 613, "shapes": 5, "gemm_ms": 9.00, "top": ((8944, 2816, 1024), 611),
                     "categories": {"elementwise": 0.54, "gemm": 0.28, "other": 0.15, "reduce": 0.02}},
    "tl_compile_triton": {"gemm_tflops": 548, "shapes": 3, "gemm_ms": 8.03, "top": ((32768, 8192, 2048), 588)},
}
"""TraceLens's figures on the shared traces (issue 29)."""


def _tracekit(name: str, out: Path) -> tuple[dict, float]:
    import tracekit

    t0 = time.perf_counter()
    run = tracekit.analyze_run(SHARED / name, out)
    return run.analysis["sections"]["ops"], time.perf_counter() - t0


def _hta_kernels(name: str) -> tuple[object, float]:
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    try:
        from hta.trace_analysis import TraceAnalysis

        ta = TraceAnalysis(trace_dir=str(SHARED / name))
        kernel_type, kernels = ta.get_gpu_kernel_breakdown(visualize=False, num_kernels=5)
        return (kernel_type, kernels), time.perf_counter() - t0
    except Exception as exc:  # HTA fails on some real traces; say so and go on
        return f"HTA failed: {type(exc).__name__}: {exc}", time.perf_counter() - t0
    finally:
        logging.disable(logging.NOTSET)


def _print_gemms(name: str, sec: dict) -> None:
    ref = TRACELENS[name]
    gemm = sec["gemm"]
    print(f"\n== {name} ==")
    print(f"{'':34s} {'tracekit':>12s} {'TraceLens':>12s}")
    print(f"{'GEMM TFLOP/s (time-weighted)':34s} {gemm['tflops']:12.1f} {ref['gemm_tflops']:12d}")
    print(f"{'GEMM shapes':34s} {gemm['shapes']:12d} {ref['shapes']:12d}")
    print(f"{'GEMM kernel time (ms)':34s} {gemm['kernel_ns'] / 1e6:12.3f} {ref['gemm_ms']:12.2f}")
    (m, n, k), tl = ref["top"]
    row = next((r for r in sec["top_ops"] if r["gemm"] and tuple(r["gemm"][1:]) == (m, n, k)), None)
    got = f"{row['tflops']:12.1f}" if row else f"{'missing':>12s}"
    print(f"{f'top shape {m},{n},{k} TFLOP/s':34s} {got} {tl:12d}")
    for r in sec["ranks"]:
        print(f"{'MFU rank ' + str(r['rank']):34s} {(r['mfu'] or 0):12.1%} {'–':>12s}  "
              f"({r['device_match']}, {r['peak_dtype']} peak {r['peak_tflops']} TFLOP/s)")
    cats = ref.get("categories")
    if cats:
        print("op categories (share of op device time): tracekit | TraceLens")
        ours = {c["category"]: c["share"] for c in sec["categories"]}
        for c in sorted(set(ours) | set(cats), key=lambda c: -ours.get(c, 0)):
            print(f"  {c:14s} {ours.get(c, 0):8.1%} | {cats.get(c, 0):6.0%}" if c in cats else
                  f"  {c:14s} {ours.get(c, 0):8.1%} |    –")
        print("  (TraceLens counts SDPA and cat under 'other'; tracekit has 'attention' and counts cat as "
              "elementwise data movement)")
        cat_share = sum(r["share"] or 0 for r in sec["top_ops"] if r["name"] == "aten::cat")
        print(f"  mapped as TraceLens does (attention and aten::cat in 'other'): elementwise "
              f"{ours.get('elementwise', 0) - cat_share:.1%}, other "
              f"{ours.get('other', 0) + ours.get('attention', 0) + cat_share:.1%}")


def _print_kernels(sec: dict, hta: object) -> None:
    print("top kernels by time — tracekit kernel summary:")
    for k in sec["kernels"][:5]:
        print(f"  {k['share']:6.1%} {k['count']:6d}x {k['total_ns'] / 1e6:9.3f} ms  {k['category']:11s} {k['name'][:70]}")
    if isinstance(hta, str):
        print("HTA kernel breakdown: " + hta)
        return
    kernel_type, kernels = hta
    print("HTA kernel type breakdown:")
    for _, r in kernel_type.iterrows():
        print(f"  {r['percentage']:6.1f}% {r['sum'] / 1e3:9.3f} ms  {r['kernel_type']}")
    print("HTA top kernels (per kernel name; 'others' = the rest):")
    for _, r in kernels.sort_values("sum (us)", ascending=False).head(6).iterrows():
        print(f"  {r['sum (us)'] / 1e3:9.3f} ms  {r['kernel_type']:13s} {str(r['name'])[:70]}")


def main() -> None:
    global SHARED
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=SHARED)
    SHARED = ap.parse_args().traces
    with tempfile.TemporaryDirectory() as tmp:
        for name in TRACELENS:
            sec, t_ours = _tracekit(name, Path(tmp) / name)
            hta, t_hta = _hta_kernels(name)
            _print_gemms(name, sec)
            _print_kernels(sec, hta)
            print(f"analysis time: tracekit analyze {t_ours:.2f} s, HTA load + kernel breakdown {t_hta:.2f} s "
                  f"(ratio {t_hta / t_ours:.1f}x)")


if __name__ == "__main__":
    main()
