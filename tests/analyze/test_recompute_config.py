"""No `recompute` finding on runs recorded without activation checkpointing (issue 32: no finding whose
cause the run's configuration contradicts). The runtime fixtures' own command line (manifest.json, the
knobs the runtime was given) says whether `--activation-checkpointing` was on; the analysis never reads it.
- fixtures/cp: ring attention's backward (`_RingAttentionBackward`, a custom autograd Function) runs
  matmuls of its own: not a re-run forward;
- fixtures/dp_fsdp: FSDP2 all-gathers the parameters again for backward (`fsdp::all_gather_copy_in`):
  not a re-run forward.
Cost: two 2-rank fixtures parsed and analyzed, ~5 s on the shared box."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracekit

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.mark.parametrize("name", ["cp", "dp_fsdp"])
def test_no_recompute_without_checkpointing(name, tmp_path):
    command = json.loads((FIXTURES / name / "manifest.json").read_text())["command"]
    assert "--activation-checkpointing" not in command  # the knob: checkpointing off in this run
    run = tracekit.analyze_run(FIXTURES / name, tmp_path / "out")
    assert "recompute" not in {f["kind"] for f in run.analysis["findings"]}
    assert run.analysis["sections"]["memory"]["recompute"] == []
    assert all(r["recompute_ops"] == 0 for r in run.analysis["sections"]["ops"]["ranks"])
