"""A rank killed inside the profiled window, while only rank 0 is profiled (`--ranks 0`)."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.record.conftest import load_comms, load_trace, profiler_steps, run_record, torchrun

KILL_STEP = 3

SCRIPT = textwrap.dedent(f"""
    import os, signal, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(8):
        if rank == 1 and step == {KILL_STEP}:
            os.kill(os.getpid(), signal.SIGKILL)  # dies mid-window, writes nothing more
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        dist.all_reduce(torch.ones(2))
""")


@pytest.fixture(scope="module")
def crash_recording(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("crash")
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    out = tmp / "out"
    res = run_record(out, torchrun(script, 2), "--ranks", "0", "--wait", "1", "--warmup", "1", "--active", "3")
    return res, out


@pytest.mark.slow
def test_survivor_trace_is_partial_but_readable(crash_recording):
    res, out = crash_recording
    assert res.returncode != 0  # torchrun's failure passes through
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "incomplete" and manifest["exit_code"] == res.returncode
    ranks = {r["rank"]: r for r in manifest["ranks"]}
    assert set(ranks) == {0, 1}
    assert ranks[1]["status"] == "killed" and ranks[1]["profiled"] is False and ranks[1]["comms_complete"] is False
    assert ranks[0]["status"] in ("exception", "signal") and ranks[0]["profiled"] is True
    assert ranks[0]["trace_partial"] is True
    assert not (out / "rank1.pt.trace.json.gz").exists()  # unprofiled rank: no trace, by request

    trace = load_trace(out / "rank0.pt.trace.json.gz")
    assert trace["tracekit"]["partial"] is True
    steps = profiler_steps(trace)
    assert steps[0] == 2 and KILL_STEP in steps and max(steps) <= 4

    from tracekit.parse.kineto import parse_kineto

    parsed = parse_kineto(out / "rank0.pt.trace.json.gz")
    assert parsed is not None


@pytest.mark.slow
def test_unprofiled_killed_rank_logged_its_collectives(crash_recording):
    res, out = crash_recording
    _, r0, footer0 = load_comms(out / "comms.rank0.jsonl")
    header1, r1, footer1 = load_comms(out / "comms.rank1.jsonl")
    assert header1["rank"] == 1 and footer1 is None  # killed: no footer, lines up to the kill readable
    assert footer0 is not None and footer0["status"] in ("exception", "signal")
    # Step 2 was complete on both ranks: same collectives, same (group, seq), same sizes.
    step2 = lambda entries: [(e["process_group"][0], e["collective_seq_id"], e["profiling_name"],  # noqa: E731
                              e["input_sizes"]) for e in entries if e["step"] == 2]
    assert step2(r1) and step2(r1) == step2(r0)
    assert {e["step"] for e in r1} == {2}
