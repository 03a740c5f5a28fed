"""The committed fixtures (fixtures/<scenario>/, made by fixtures/make_fixtures.py) are complete and consistent.

Reads only files (plain json/gzip), so it is fast: every rank's trace has the profiled steps and the
runtime's labels; every collective in the comms logs is matched by the same op with the same sizes on
every rank of its group; routing counts add up to the tokens routed; the manifest's groups are the
layout's; each scenario shows its dimension's own labels and groups.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from pathlib import Path

import pytest

from instrumented_runtime.config import RunConfig
from instrumented_runtime.parallel_dims import ParallelDims
from tests.runtime._traces import RankTrace, load_jsonl

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SCENARIOS = ["dp_ddp", "dp_fsdp", "tp", "cp", "ep", "pp_1f1b", "faults", "pp_imbalance"]


class Run:
    def __init__(self, name: str) -> None:
        self.dir = FIXTURES / name
        self.manifest = json.loads((self.dir / "manifest.json").read_text())
        self.gt = json.loads((self.dir / ".ground_truth.json").read_text())
        self.cfg = RunConfig.from_dict(self.manifest["config"])
        self.world = self.manifest["world_size"]
        self._traces: dict[int, RankTrace] = {}

    def trace(self, r: int) -> RankTrace:
        if r not in self._traces:
            self._traces[r] = RankTrace(self.dir / f"rank{r}.pt.trace.json.gz")
        return self._traces[r]

    def comms(self, r: int) -> list[dict]:
        return load_jsonl(self.dir / f"comms.rank{r}.jsonl")


_RUNS: dict[str, Run] = {}


@pytest.fixture(params=SCENARIOS)
def run(request) -> Run:
    if request.param not in _RUNS:
        _RUNS[request.param] = Run(request.param)
    return _RUNS[request.param]


def test_files_and_manifest(run):
    files = {p.name for p in run.dir.iterdir()}
    for r in range(run.world):
        for f in (f"rank{r}.pt.trace.json.gz", f"comms.rank{r}.jsonl", f"metrics.rank{r}.jsonl"):
            assert f in files
    assert len([f for f in files if f.endswith(".pt.trace.json.gz")]) == run.world
    assert sum(p.stat().st_size for p in run.dir.iterdir()) < 300 * 1024
    m = run.manifest
    assert run.world == run.cfg.layout.pp * run.cfg.layout.dp * run.cfg.layout.cp * run.cfg.layout.tp
    pd = ParallelDims.from_config(run.cfg, run.world)
    assert m["layout"]["groups"] == json.loads(json.dumps(pd.layout.groups()))
    assert set(m["clock_anchors"]) == {str(r) for r in range(run.world)} == set(m["hosts"])
    for a in m["clock_anchors"].values():
        assert a["post_barrier"]["time_ns"] >= a["start"]["time_ns"]
        assert a["post_barrier"]["monotonic_ns"] >= a["start"]["monotonic_ns"]
    rows = run.cfg.global_batch_size
    assert m["tokens_per_step"] == rows * run.cfg.seq_len
    assert m["torch_version"] and m["command"][1:3] == ["-m", "instrumented_runtime"]
    log = json.loads((run.dir / "train_log.json").read_text())
    assert all(math.isfinite(x) for x in log["loss"]) and log["tokens"] == [m["tokens_per_step"]] * run.cfg.steps


def test_every_rank_trace_has_profiled_steps_and_labels(run):
    for r in range(run.world):
        t = run.trace(r)
        assert t.trace["distributedInfo"]["rank"] == r
        assert len(t.windows) == run.cfg.profile_steps == len(run.manifest["profiled_steps"])
        for w in t.windows:
            inside = [e["name"] for e in t.main if w[0] <= float(e["ts"]) * 1000 <= w[1]]
            assert "data:load" in inside and "optimizer:step" in inside


def test_collectives_match_across_each_group(run):
    """Same (group, seq) on every member: same op, same input sizes (for all_to_all: the splits transpose)."""
    by_key: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r in range(run.world):
        lines = run.comms(r)
        assert lines[0]["type"] == "header" and lines[-1]["type"] == "footer"
        for e in lines[1:-1]:
            if not e["is_p2p"]:
                by_key[(e["process_group"][0], e["collective_seq_id"])][r] = e
    assert by_key
    for key, entries in by_key.items():
        ranks = next(iter(entries.values()))["group_ranks"]
        assert sorted(entries) == sorted(ranks), key
        ops = {e["profiling_name"] for e in entries.values()}
        assert len(ops) == 1, (key, ops)
        if "all_to_all" in ops.pop():
            for i, a in entries.items():
                for j, b in entries.items():
                    assert a["in_split_sizes"][ranks.index(j)] == b["out_split_sizes"][ranks.index(i)]
        else:
            assert len({json.dumps(e["input_sizes"]) for e in entries.values()}) == 1, key


def test_p2p_sends_meet_receives(run):
    sends, recvs = defaultdict(list), defaultdict(list)
    for r in range(run.world):
        for e in run.comms(r)[1:-1]:
            if e["is_p2p"]:
                op = e["profiling_name"].split(":")[1]
                (sends if op == "send" else recvs)[(r, e["peer"]) if op == "send" else (e["peer"], r)].append(
                    e["input_sizes"] or e["output_sizes"])
    assert sends.keys() == recvs.keys()
    for k in sends:
        assert sends[k] == recvs[k], k


def test_routing_counts_add_up(run):
    moe_layers = run.manifest["layout"]["moe_layers"]
    if not (run.dir / "routing.rank0.jsonl").exists():
        pytest.skip("no MoE")
    k = run.cfg.model.top_k
    tokens_per_rank = run.cfg.global_batch_size // run.cfg.layout.dp * run.cfg.seq_len // (run.cfg.layout.cp * run.cfg.layout.tp)
    stage_of_layer = {lid: s for s, ids in enumerate(run.manifest["layout"]["stage_layer_ids"]) for lid in ids}
    for r in range(run.world):
        rows = load_jsonl(run.dir / f"routing.rank{r}.jsonl")
        per: dict[tuple, list] = defaultdict(list)
        for row in rows:
            per[(row["step"], row["layer"])].append(row)
            assert 0 <= row["dropped"] <= row["tokens"]
        pp_rank = run.cfg.layout.coords(r)["pp"]
        mine = [lid for lid in moe_layers if stage_of_layer[lid] % run.cfg.layout.pp == pp_rank]
        assert sorted({key[1] for key in per}) == mine
        for (step, layer), rs in per.items():
            assert sorted(x["expert"] for x in rs) == list(range(run.cfg.model.num_experts))
            assert sum(x["tokens"] for x in rs) == tokens_per_rank * k
            cap = math.ceil(run.cfg.model.capacity_factor * tokens_per_rank / run.cfg.layout.microbatches * k
                            / run.cfg.model.num_experts) * run.cfg.layout.microbatches
            assert {x["capacity"] for x in rs} == {cap}


LABELS = {
    "dp_ddp": [r"^dp:grad_all_reduce$"],
    "dp_fsdp": [r"^dp:fsdp_all_gather$", r"^dp:fsdp_reduce_scatter$"],
    "tp": [r"^tp:attn:sp_all_gather$", r"^tp:mlp:sp_reduce_scatter:bwd$", r"^tp:sp_grad_all_reduce$"],
    "cp": [r"^cp:"],
    "ep": [r"^ep:dispatch$", r"^ep:combine$"],
    "pp_1f1b": [r"^pp:"],
}


@pytest.mark.parametrize("name", list(LABELS))
def test_each_dimension_shows_its_collectives(name):
    run = _RUNS.get(name) or Run(name)
    callers = {e.get("caller") for r in range(run.world) for e in run.comms(r)[1:-1]}
    for pat in LABELS[name]:
        assert any(c and re.search(pat, c) for c in callers), (pat, sorted(c for c in callers if c))


def test_pipeline_labels_cover_every_microbatch():
    run = Run("pp_1f1b")
    m = run.cfg.layout.microbatches
    for r in range(run.world):
        names = {e["name"] for e in run.trace(r).named("pp:")}
        assert names == {f"pp:stage{r}:mb{i}:{ph}" for i in range(m) for ph in ("fwd", "bwd")}


def test_ring_attention_hops_in_cp_trace():
    run = Run("cp")
    for r in range(run.world):
        names = {e["name"] for e in run.trace(r).events}
        assert {"cp:ring_hop0", "cp:ring_hop1", "cp:ring_hop0:bwd"} <= names


def test_faults_fixture_ground_truth():
    run = Run("faults")
    kinds = {f["kind"]: f for f in run.gt["faults"]}
    assert set(kinds) == {"slow_rank", "router_skew", "slow_link", "host_stall", "groups_span_hosts"}
    assert kinds["slow_link"]["pg_desc"] == "mesh_ep"
    stall = [float(e["dur"]) for e in run.trace(0).named("data:load")]
    assert stall and min(stall) >= kinds["host_stall"]["stall_ms"] * 1e3
