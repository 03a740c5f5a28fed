"""ParallelDims arithmetic, config validation, stage splitting and the fault ground truth (no processes)."""

from __future__ import annotations

import itertools

import pytest

from instrumented_runtime.config import FaultConfig, ModelConfig, RunConfig, parse_args
from instrumented_runtime.faults import ground_truth_faults
from instrumented_runtime.parallel_dims import ParallelDims
from instrumented_runtime.pipeline import stage_indices
from tracekit.layout import ParallelLayout


@pytest.mark.parametrize("pp,dp,cp,tp,ep", [(2, 2, 2, 2, 4), (1, 4, 1, 2, 2), (2, 1, 2, 2, 2), (1, 2, 3, 1, 3)])
def test_groups_partition_the_world(pp, dp, cp, tp, ep):
    pd = ParallelDims(layout=ParallelLayout(pp=pp, dp=dp, cp=cp, tp=tp, ep=ep), world_size=pp * dp * cp * tp)
    groups = pd.layout.groups()
    sizes = {"pp": pp, "dp": dp, "cp": cp, "tp": tp, "dp_cp": dp * cp, "ep": ep, "edp": dp * cp // ep}
    for dim, gs in groups.items():
        flat = sorted(r for g in gs for r in g)
        assert flat == list(range(pd.world_size)), dim          # every rank in exactly one group
        assert {len(g) for g in gs} == {sizes[dim]}, dim
    for r in range(pd.world_size):
        c = pd.layout.coords(r)
        assert pd.layout.rank_of(c) == r
        # a group of dim X is exactly the ranks differing from r only in coordinate X
        for dim in ("pp", "dp", "cp", "tp"):
            (g,) = [g for g in groups[dim] if r in g]
            others = {k: v for k, v in c.items() if k in ("pp", "dp", "cp", "tp") and k != dim}
            expect = [q for q in range(pd.world_size)
                      if all(pd.layout.coords(q)[k] == v for k, v in others.items())]
            assert sorted(g) == expect
    # ep groups live inside one dp_cp group (same pp, tp) and the edp groups hold the same expert shard
    for g in groups["ep"]:
        assert len({(pd.layout.coords(r)["pp"], pd.layout.coords(r)["tp"]) for r in g}) == 1
        assert sorted(pd.layout.coords(r)["ep"] for r in g) == list(range(ep))
    for g in groups["edp"]:
        assert len({pd.layout.coords(r)["ep"] for r in g}) == 1


def test_validation_errors():
    with pytest.raises(ValueError, match="world size"):
        ParallelDims(layout=ParallelLayout(pp=2, dp=2), world_size=8)
    with pytest.raises(ValueError, match="ep 3"):
        RunConfig.build(dp=2, cp=2, ep=3)
    with pytest.raises(ValueError, match="divisible by dp\\*microbatches"):
        RunConfig.build(dp=2, microbatches=3, global_batch_size=8)
    with pytest.raises(ValueError, match="warm-up"):
        RunConfig.build(steps=2, profile_steps=2)


def test_stage_layers_of_the_fault_and_stage_indices():
    cfg = RunConfig.build(pp=2, microbatches=2, faults=FaultConfig(stage_layers=[3, 1]))
    assert [list(r) for r in cfg.stage_split.stage_layer_ids(cfg.model.num_layers)] == [[0, 1, 2], [3]]
    even = RunConfig.build(pp=2, microbatches=2, model=ModelConfig(num_layers=5))
    assert [list(r) for r in even.stage_split.stage_layer_ids(5)] == [[0, 1, 2], [3, 4]]
    assert stage_indices(1, 2, 2) == [1, 3]


def test_cli_parses_every_fault_knob():
    cfg = parse_args(["--pp", "2", "--dp", "2", "--cp", "2", "--tp", "2", "--ep", "4", "--schedule", "1f1b",
                      "--microbatches", "1", "--steps", "4", "--slow-rank", "5", "--slow-factor", "2.5",
                      "--stage-layers", "3,1", "--router-bias", "1=2.0,3=0.5", "--no-overlap",
                      "--slow-link", "tp=0.005,ep=0.002", "--host-stall-rank", "2", "--host-stall-ms", "30",
                      "--uneven-seq-rank", "3", "--ranks-per-host", "4", "--out", "x"])
    f = cfg.faults
    assert (f.slow_rank, f.slow_factor, f.stage_layers) == (5, 2.5, [3, 1])
    assert f.router_bias == {1: 2.0, 3: 0.5} and f.slow_links == {"tp": 0.005, "ep": 0.002}
    assert (f.host_stall_rank, f.host_stall_ms, f.uneven_seq_rank, f.no_overlap) == (2, 30.0, 3, True)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg   # survives the trip to the forked ranks
    with pytest.raises(SystemExit):
        parse_args(["--slow-link", "xx=1", "--out", "x"])


def test_ground_truth_lists_each_fault_with_its_targets():
    cfg = RunConfig.build(pp=2, dp=2, cp=2, tp=2, ep=4, microbatches=1, steps=3, profile_steps=1, ranks_per_host=4,
                    faults=FaultConfig(slow_rank=5, slow_factor=2.0, stage_layers=[3, 1], router_bias={2: 3.0},
                                       no_overlap=True, slow_links={"tp": 0.005}, host_stall_rank=6,
                                       host_stall_ms=40.0, uneven_seq_rank=9))
    pd = ParallelDims.from_config(cfg, 16)
    by_kind = {f["kind"]: f for f in ground_truth_faults(cfg, pd)}
    assert set(by_kind) == {"slow_rank", "stage_imbalance", "router_skew", "no_overlap", "too_few_microbatches",
                            "slow_link", "host_stall", "uneven_sequence_length", "groups_span_hosts"}
    assert by_kind["slow_rank"]["ranks"] == [5] and by_kind["slow_rank"]["factor"] == 2.0
    assert by_kind["stage_imbalance"]["stages"] == [0] and by_kind["stage_imbalance"]["ranks"] == list(range(8))
    assert by_kind["router_skew"]["experts"] == [2]
    assert by_kind["too_few_microbatches"]["theoretical_bubble"] == pytest.approx(0.5)
    assert by_kind["slow_link"]["groups"] == pd.layout.groups()["tp"] and by_kind["slow_link"]["pg_desc"] == "mesh_tp"
    # rank 9 = pp1, dp0 -> the whole dp replica 0 (both stages, all cp/tp) has the long sequences
    assert by_kind["uneven_sequence_length"]["ranks"] == [r for r in range(16) if pd.layout.coords(r)["dp"] == 0]
    # 4 ranks per host: tp (adjacent) stays on a host, dp (stride 4) crosses hosts
    spans = by_kind["groups_span_hosts"]["groups"]
    assert "tp" not in spans and "cp" not in spans and "dp" in spans and "pp" in spans
    for g in itertools.chain.from_iterable(spans.values()):
        assert len({r // 4 for r in g}) > 1


@pytest.mark.parametrize("args,message", [
    (["--pp", "2", "--stage-layers", "3,3"], "--stage-layers [3, 3] must list 2 counts"),
    (["--dp", "2", "--slow-rank", "2"], "--slow-rank 2 is not a rank of a 2-rank job"),
    (["--tp", "3"], "--num-heads 4 is not divisible by --tp 3"),
    (["--dp", "2", "--cp", "2", "--ep", "3"], "ep 3 must divide dp*cp = 4"),
    (["--router-bias", "9=1.0"], "--router-bias names experts [9]"),
])
def test_bad_layouts_are_refused_before_any_rank_starts(args, message):
    with pytest.raises(ValueError) as e:
        parse_args([*args, "--out", "x"])
    assert message in str(e.value)


def test_cli_reports_config_errors_without_a_traceback(tmp_path):
    from tests.runtime._runs import run_cli

    proc = run_cli(["--pp", "2", "--stage-layers", "3,3", "--out", str(tmp_path / "o")], timeout_s=120)
    assert proc.returncode == 2
    assert "error: --stage-layers [3, 3]" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()
