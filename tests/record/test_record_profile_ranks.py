"""Partial tracing: `tracekit record --profile-ranks 0,2` on a 3-rank gloo job traces ranks 0 and 2, logs
every rank's collectives, says so in the manifest, and `tracekit analyze` reports rank 1 as log-only (present
through its log), never as missing. Expected values come from the files themselves (plain json/gzip)."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.record.conftest import assert_job_ok, load_comms, load_trace, run_record, torchrun

SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(7):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        dist.all_reduce(torch.ones(2))
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def partial_recording(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("partial")
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    out = tmp / "out"
    res = run_record(out, torchrun(script, 3), "--profile-ranks", "0,2", "--wait", "1", "--warmup", "1",
                     "--active", "2", "--no-profile-memory")
    assert_job_ok(res, out)
    return out


@pytest.mark.slow
def test_untraced_rank_has_a_log_and_no_trace(partial_recording):
    out = partial_recording
    assert (out / "rank0.pt.trace.json.gz").is_file() and (out / "rank2.pt.trace.json.gz").is_file()
    assert not (out / "rank1.pt.trace.json.gz").exists()
    logged = {}
    for r in range(3):
        header, entries, footer = load_comms(out / f"comms.rank{r}.jsonl")
        assert header["rank"] == r and footer is not None and entries
        logged[r] = [(e["process_group"][0], e["collective_seq_id"], e["profiling_name"]) for e in entries
                     if not e.get("is_p2p")]
    assert logged[1] == logged[0] == logged[2]  # the untraced rank logged the same collectives
    assert load_trace(out / "rank0.pt.trace.json.gz")["traceEvents"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["traced_ranks"] == [0, 2] and manifest["log_only_ranks"] == [1]
    assert manifest["missing_ranks"] == [] and manifest["config"]["ranks"] == [0, 2]


@pytest.mark.slow
def test_analyze_reports_the_untraced_rank_as_log_only(partial_recording, tmp_path):
    from tracekit.analysis import analyze_run

    analyze_run(partial_recording, tmp_path / "a")
    analysis = json.loads((tmp_path / "a" / "analysis.json").read_text())
    inputs = analysis["sections"]["inputs"]
    assert inputs["log_only_ranks"] == [1] and inputs["traced_ranks"] == [0, 2]
    assert inputs["missing_ranks"] == [] and inputs["ranks"] == [0, 1, 2]
    assert not [f for f in analysis["findings"] if f["kind"] == "missing_ranks"]
    assert any("log-only" in w and "[1]" in w for w in inputs["warnings"])
    # the untraced rank is in the cross-rank numbers, from its log; not in the breakdowns
    per_rank = {row["rank"]: row for row in analysis["sections"]["matching"]["per_rank"]}
    _, entries, _ = load_comms(partial_recording / "comms.rank1.jsonl")
    assert 1 in per_rank and 0 < per_rank[1]["instances"] <= len(entries)
    assert 1 not in {row["rank"] for row in analysis["ranks"]}
