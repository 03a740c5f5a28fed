"""`with tracekit.Recorder(out) as rec: ... rec.step()` in a single process (no torch.distributed)."""

from __future__ import annotations

import json

import pytest

from tests.record.conftest import load_comms, load_trace, profiler_steps


def test_recorder_api_profiles_the_requested_steps(tmp_path):
    torch = pytest.importorskip("torch")
    import tracekit
    from torch.profiler import ProfilerAction, schedule

    out = tmp_path / "api"
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tracekit.Recorder(out, wait=1, warmup=1, active=2) as rec:
        for _ in range(6):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            rec.step()
    fn = schedule(wait=1, warmup=1, active=2, repeat=1)
    want = [s for s in range(6) if fn(s) in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)]
    assert profiler_steps(load_trace(out / "rank0.pt.trace.json.gz")) == want
    manifest = json.loads((out / "manifest.json").read_text())
    [rank] = manifest["ranks"]
    assert rank["status"] == "ok" and rank["profiled_steps"] == want and rank["rank_source"] == "single_process"
    header, entries, footer = load_comms(out / "comms.rank0.jsonl")
    assert entries == [] and footer["status"] == "ok"
