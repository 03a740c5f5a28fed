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


def test_time_based_window_is_chosen_from_the_fastest_warmup_step(tmp_path):
    """One slow warmup step (the first one the profiler is on runs slow; on a loaded box it once took 20x
    the step) must not shorten the window: the length comes from the fastest warmup step, wherever the
    slow one falls (here the last, which the window used to be chosen from)."""
    import time

    pytest.importorskip("torch")
    from tracekit.record.config import ProfileSchedule, RecordConfig
    from tracekit.record.recorder import RankRecorder

    schedule = ProfileSchedule(wait=1, warmup=2, active=3, min_window_ms=2000, max_active=40)
    config = RecordConfig(out_dir=str(tmp_path / "rec"), schedule=schedule, log_collectives=False,
                          clock_barrier=False, record_shapes=False, with_flops=False, profile_memory=False)
    rec = RankRecorder(config, first_step=0, mode="api")
    rec.on_step()  # end of step 0 (start-up); step 1 is the first warmup step
    time.sleep(0.02)  # a warmup step of about 20 ms: asks for ceil(2000 / 20) -> capped at 40
    rec.on_step()
    time.sleep(1.0)  # a slow warmup step: alone it would ask for ceil(2000 / 1000) -> the minimum, 3
    rec.on_step()
    choice = rec.window_choice
    rec.finalize("ok")
    fast, slow = choice["warmup_steps_ns"]
    assert slow >= 1_000_000_000 > fast
    assert choice["warmup_step_ns"] == fast
    assert choice["active"] == schedule.active_for(fast) == schedule.active > 3
