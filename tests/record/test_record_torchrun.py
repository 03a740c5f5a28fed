"""`tracekit record -- torchrun ... train.py` on a DDP script that knows nothing of tracekit (2 gloo ranks)."""

from __future__ import annotations

import json
import textwrap
from collections import Counter

import pytest

from tests.record.conftest import expected_active_steps, load_comms, load_trace, profiler_steps, run_record, torchrun

NUM_STEPS = 7
D_IN, D_HID, D_OUT = 16, 32, 4
PARAM_NELEMS = D_IN * D_HID + D_HID + D_HID * D_OUT + D_OUT  # one DDP bucket holds every parameter

DDP_SCRIPT = textwrap.dedent(f"""
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pair = dist.new_group([0, 1], group_desc="pair")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear({D_IN}, {D_HID}), torch.nn.ReLU(), torch.nn.Linear({D_HID}, {D_OUT})))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range({NUM_STEPS}):
        opt.zero_grad()
        model(torch.randn(8, {D_IN})).sum().backward()
        opt.step()
        # explicit collectives of several kinds, after the optimizer step (so they belong to the next step)
        out = torch.empty(10); dist.all_gather_into_tensor(out, torch.ones(5))
        a2a_out = torch.empty(6 if rank == 0 else 4)
        in_splits, out_splits = ([2, 3], [2, 4]) if rank == 0 else ([4, 1], [3, 1])
        dist.all_to_all_single(a2a_out, torch.ones(5), out_splits, in_splits)
        dist.all_reduce(torch.ones(7), group=pair)
        if rank == 0:
            dist.send(torch.ones(3), dst=1)
        else:
            dist.recv(torch.empty(3), src=0)
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def ddp_recording(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    script = tmp / "train.py"
    script.write_text(DDP_SCRIPT)
    out = tmp / "out"
    res = run_record(out, torchrun(script, 2), "--wait", "1", "--warmup", "1", "--active", "3")
    return res, out


@pytest.mark.slow
def test_every_rank_recorded_with_requested_steps(ddp_recording):
    res, out = ddp_recording
    assert res.returncode == 0, res.stderr[-3000:]
    want = expected_active_steps(1, 1, 3, 1, NUM_STEPS)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["missing_ranks"] == [] and manifest["status"] == "ok"
    assert [r["rank"] for r in manifest["ranks"]] == [0, 1]
    assert manifest["backend"] == "gloo" and manifest["hosts"] and manifest["torch_version"]
    for r in manifest["ranks"]:
        assert r["status"] == "ok" and r["rank_source"] == "process_group" and r["profiled_steps"] == want
        assert r["comms_complete"] is True and r["dispatch_errors"] == 0
    # Flight Recorder dump per rank (gloo keeps one by default).
    for rank in (0, 1):
        fr = json.loads((out / f"flight_recorder.rank{rank}.json").read_text())
        assert fr["entries"]
        # Clock anchors: start/end pairs, barrier samples and one trace anchor per kept step.
        anchors = manifest["clock_anchors"][str(rank)]
        assert len(anchors["barrier_samples"]) == 3
        assert [a["step"] for a in anchors["trace_anchors"]] == want
        assert anchors["start"]["wall_ns"] < anchors["end"]["wall_ns"]
        trace = load_trace(out / f"rank{rank}.pt.trace.json.gz")
        assert profiler_steps(trace) == want


@pytest.mark.slow
def test_collectives_logged_with_group_seq_and_sizes(ddp_recording):
    res, out = ddp_recording
    assert res.returncode == 0, res.stderr[-3000:]
    want = expected_active_steps(1, 1, 3, 1, NUM_STEPS)
    logs = {}
    for rank in (0, 1):
        header, entries, footer = load_comms(out / f"comms.rank{rank}.jsonl")
        assert header["rank"] == rank and footer["status"] == "ok"
        logs[rank] = entries
        assert sorted({e["step"] for e in entries}) == want
        per_step = Counter((e["step"], e["profiling_name"]) for e in entries)
        for step in want:
            # per step: DDP bucket all_reduce + pair all_reduce, one all_gather, one all_to_all, one p2p
            assert per_step[(step, "gloo:all_reduce")] == 2
            assert per_step[(step, "gloo:all_gather")] == 1
            assert per_step[(step, "gloo:all_to_all")] == 1
            assert per_step[(step, "gloo:send" if rank == 0 else "gloo:recv")] == 1
        ddp = [e for e in entries if e["input_sizes"] == [[PARAM_NELEMS]]]
        assert len(ddp) == len(want) and all(e["process_group"][1] == "default_pg" for e in ddp)
        pair = [e for e in entries if e["process_group"][1] == "pair"]
        assert [e["collective_seq_id"] for e in pair] == list(range(1, len(want) + 1))
        assert all(e["input_sizes"] == [[7]] and e["group_ranks"] == [0, 1] for e in pair)
        a2a = [e for e in entries if e["profiling_name"] == "gloo:all_to_all"]
        assert a2a[0]["in_split_sizes"] == ([2, 3] if rank == 0 else [4, 1])
        assert a2a[0]["out_split_sizes"] == ([2, 4] if rank == 0 else [3, 1])
        p2p = [e for e in entries if e["is_p2p"]]
        assert [e["p2p_seq_id"] for e in p2p] == list(range(1, len(want) + 1))
        assert all(e["peer"] == 1 - rank for e in p2p)
        default = [e["collective_seq_id"] for e in entries if e["process_group"][1] == "default_pg" and not e["is_p2p"]]
        assert default == list(range(1, len(default) + 1))
        # tracekit record takes no completion times (the trace has them): each entry says so.
        assert all(e["time_discovered_completed_ns"] is None and e["state"] == "scheduled" for e in entries)
        assert all(e["source"] == "c10d_dispatcher" for e in entries)
    # The same (group, seq) is the same collective on both ranks.
    key = lambda e: (e["process_group"][0], e["is_p2p"], e["collective_seq_id"] or e["p2p_seq_id"])  # noqa: E731
    r0 = {key(e): e for e in logs[0] if not e["is_p2p"]}
    r1 = {key(e): e for e in logs[1] if not e["is_p2p"]}
    assert r0.keys() == r1.keys()
    for k in r0:
        assert r0[k]["profiling_name"] == r1[k]["profiling_name"] and r0[k]["step"] == r1[k]["step"]


@pytest.mark.slow
def test_tracekit_parser_reads_the_recording(ddp_recording, tmp_path):
    from tracekit.parse.run import parse_run

    res, out = ddp_recording
    assert res.returncode == 0, res.stderr[-3000:]
    want = expected_active_steps(1, 1, 3, 1, NUM_STEPS)
    result = parse_run(out, tmp_path / "store", progress=False)
    assert [s for s in result.skipped if "record.rank" in s["file"]] == []
    store = result.store
    assert store.ranks() == [0, 1]
    steps = store.table("steps").to_pylist()
    for rank in (0, 1):
        assert sorted(s["step"] for s in steps if s["rank"] == rank) == want
    coll = store.table("collectives").to_pylist()
    logged = [c for c in coll if c["source"] == "comms-log"]
    for rank in (0, 1):
        _, entries, _ = load_comms(out / f"comms.rank{rank}.jsonl")
        mine = [c for c in logged if c["rank"] == rank]
        assert len(mine) == len(entries)
        assert {(c["pg_name"], c["seq"], c["op"]) for c in mine if not c["is_p2p"]} == {
            (e["process_group"][0], e["collective_seq_id"], e["profiling_name"].split(":")[1])
            for e in entries if not e["is_p2p"]}
        # The profiler saw the same number of all_reduce calls in the kept steps as the log.
        kineto_ar = [c for c in coll if c["rank"] == rank and c["source"] == "kineto" and c["op"] == "all_reduce"]
        assert len(kineto_ar) == sum(e["profiling_name"] == "gloo:all_reduce" for e in entries)
