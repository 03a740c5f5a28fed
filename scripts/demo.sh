#!/usr/bin/env bash
# The demo: record a five-dimension run of the reference runtime with an injected fault, analyse it, and
# write the report; then simulate a 64-GPU five-dimension NCCL cluster with one fault and analyse that too.
# Sets up .venv first if needed.   scripts/demo.sh [OUT]          both demos
#                                  scripts/demo.sh --sim-only [OUT]  only the simulated cluster (< 1 min)
set -euo pipefail
cd "$(dirname "$0")/.."
SIM_ONLY=0
if [[ "${1:-}" == "--sim-only" ]]; then SIM_ONLY=1; shift; fi
bash scripts/setup.sh
OUT=${1:-demo-out}
rm -rf "$OUT"
if [[ $SIM_ONLY == 0 ]]; then
  echo "[demo] running the reference runtime: pp2 x dp2 x cp2 x tp2 (16 gloo ranks), ep over dp x cp, rank 5 slowed 2x" >&2
  .venv/bin/python -m instrumented_runtime --pp 2 --dp 2 --cp 2 --tp 2 --ep 4 --schedule 1f1b --microbatches 4 \
    --steps 4 --slow-rank 5 --slow-factor 2.0 --out "$OUT/traces"
  echo "[demo] analysing" >&2
  .venv/bin/python -m tracekit analyze "$OUT/traces" --out "$OUT/report"
fi
echo "[demo] simulating a GPU cluster: 8 hosts x 8 H100, pp2 x dp4 x cp2 x tp4 (64 NCCL ranks), ep2 over dp x cp, the GPU of rank 13 1.3x slower" >&2
.venv/bin/python -m tracekit simulate --pp 2 --dp 4 --cp 2 --tp 4 --ep 2 --schedule 1f1b --microbatches 4 \
  --model tiny-moe --micro-batch-size 8 --cluster 8x8-h100 --fault slow-gpu=13:1.3 --steps 2 --seed 0 --out "$OUT/sim-traces"
echo "[demo] analysing the simulated cluster (the answer key is $OUT/sim-traces/.ground_truth.json)" >&2
.venv/bin/python -m tracekit analyze "$OUT/sim-traces" --out "$OUT/sim-report"
echo
if [[ $SIM_ONLY == 0 ]]; then
  ABS=$(cd "$OUT/report" && pwd)
  echo "Report:  $ABS/report.html"
  echo "Summary: $ABS/summary.md"
fi
ABS=$(cd "$OUT/sim-report" && pwd)
echo "Simulated cluster report:  $ABS/report.html   (injected: rank 13's GPU 1.3x slower)"
