"""`tracekit record -- python -m instrumented_runtime ...`: the runtime records itself into --out."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.record.conftest import PY, load_comms, load_trace, profiler_steps, run_record

pytestmark = pytest.mark.skipif(importlib.util.find_spec("instrumented_runtime") is None,
                                reason="instrumented_runtime (reference runtime) is not in this checkout")

STEPS, PROFILE_STEPS = 4, 2


@pytest.mark.slow
def test_runtime_recording_lands_in_out_dir(tmp_path):
    out = tmp_path / "out"
    res = run_record(out, [PY, "-m", "instrumented_runtime", "--dp", "2", "--steps", str(STEPS),
                           "--profile-steps", str(PROFILE_STEPS)], timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "recorded itself (instrumented_runtime)" in res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["producer"] == "instrumented_runtime"  # the runtime's own manifest is kept
    ours = manifest["tracekit_record"]
    assert ours["exit_code"] == 0 and ours["missing_ranks"] == [] and ours["status"] == "ok"
    assert ours["command"][-2:] == ["--out", str(out.resolve())]  # --out routed to the runtime
    assert not list(out.glob("record.rank*.json"))  # the injected recorder stayed out of the way
    want = list(range(STEPS - PROFILE_STEPS, STEPS))
    for rank in range(manifest["world_size"]):
        assert profiler_steps(load_trace(out / f"rank{rank}.pt.trace.json.gz")) == want
        _, entries, footer = load_comms(out / f"comms.rank{rank}.jsonl")
        assert entries and all(e["process_group"][0] for e in entries)

    from tracekit.parse.run import parse_run

    store = parse_run(out, tmp_path / "store", progress=False).store
    assert store.ranks() == list(range(manifest["world_size"]))
    steps = store.table("steps").to_pylist()
    assert sorted({s["step"] for s in steps}) == want
