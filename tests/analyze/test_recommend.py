"""Recommendation rules: advice text names the change, savings follow their stated formulas."""

from __future__ import annotations

import pytest

from tracekit.analyze.pipeline import PipelineResult
from tracekit.analyze.unoverlapped import UnoverlappedResult
from tracekit.assess.reconcile import analyze_recommendations, reconcile
from tracekit.findings import recommend
from tracekit.findings.evidence import (BubbleEvidence, CollectiveEvidence, Evidence, PlacementEvidence,
                                        RoutingSkewEvidence, StageImbalanceEvidence, StragglerEvidence)
from tracekit.findings.finding import Finding, FindingKind, Severity

MS = 1_000_000


def test_bubble_advice_targets_small_bubble():
    a = recommend.advise_bubble(p=2, m=1, v=1, schedule="1f1b", measured_bubble=0.5, window_ns=100 * MS)
    # smallest m' with (p−1)/(m'+p−1) ≤ 0.2 is 4
    assert a.evidence["recommended_microbatches"] == 4
    assert a.evidence["predicted_bubble"] == pytest.approx(1 / 5)
    # busy 50 ms stays; window becomes 50 / (1 − 0.2) = 62.5 ms
    assert a.saving_ns == pytest.approx(100 * MS - 62.5 * MS)
    assert "from 1 to 4" in a.text


def test_bubble_advice_at_batch_limit_suggests_interleaving():
    a = recommend.advise_bubble(p=4, m=4, v=1, schedule="1f1b", measured_bubble=3 / 7, window_ns=70 * MS,
                                max_microbatches=4)
    assert a.evidence["recommended_chunks_per_rank"] == 2 and a.evidence["recommended_microbatches"] == 4
    assert a.evidence["predicted_bubble"] == pytest.approx(3 / 11)
    assert "interleaved" in a.text
    assert a.saving_ns == pytest.approx(70 * MS * (1 - (4 / 7) / (8 / 11)))


def test_imbalance_without_layers_uses_mean_bound():
    a = recommend.advise_imbalance(stage_compute_ns=[30 * MS, 10 * MS, 20 * MS], stage_layers=None, num_microbatches=5)
    assert a.saving_ns == pytest.approx(4 / 5 * (30 - 20) * MS)
    assert "Stage 0" in a.text


def test_imbalance_fits_fixed_plus_per_layer_cost():
    # c = fixed + per_layer·layers: 3 layers 50 ms, 1 layer 30 ms → 10 ms per layer, 20 ms fixed
    a = recommend.advise_imbalance(stage_compute_ns=[50 * MS, 30 * MS], stage_layers=[3, 1], num_microbatches=4)
    assert a.evidence["per_layer_ns"] == 10 * MS and a.evidence["fixed_ns_per_stage"] == 20 * MS
    assert a.evidence["recommended_stage_layers"] == [2, 2]
    assert a.saving_ns == pytest.approx(3 / 4 * (50 - 40) * MS)
    assert "move layer 2 from stage 0 to stage 1" in a.text


def test_imbalance_no_better_split_gives_no_advice():
    # 2 vs 3 layers at 10 ms each: no split of 5 layers does better than 30 ms
    a = recommend.advise_imbalance(stage_compute_ns=[20 * MS, 30 * MS], stage_layers=[2, 3], num_microbatches=4)
    assert a.text == "" and a.saving_ns == 0


def test_routing_skew_saving_and_text():
    a = recommend.advise_routing_skew(layer=3, expert=2, skew=2.4, hot_rank_expert_ns=9 * MS,
                                      mean_rank_expert_ns=5 * MS, aux_loss_weight=0.01, capacity_factor=1.25,
                                      dropped_fraction=0.3)
    assert a.saving_ns == pytest.approx(3 * 4 * MS)
    assert "Expert 2 of MoE layer 3" in a.text and "0.1" in a.text and "30%" in a.text


def test_recommendations_section_sorts_and_carries_formula_and_cause():
    f_dp = Finding(kind=FindingKind.UNOVERLAPPED_COLLECTIVE, severity=Severity.WARNING, summary="dp exposed",
                   ranks=(0, 1), dim="dp", recommendation="bucket", est_saving_ns=7 * MS,
                   evidence=CollectiveEvidence(op="all_reduce", transfer_exposed_ns_per_step=7 * MS,
                                               share_of_step=0.2, saving_formula="exposed"))
    f_str = Finding(kind=FindingKind.STRAGGLER, severity=Severity.CRITICAL, summary="late", ranks=(3,),
                    dim="world", recommendation="inspect", est_saving_ns=2 * MS,
                    evidence=StragglerEvidence(cause="compute", delay_ns_per_step=2 * MS))
    f_own = Finding(kind=FindingKind.PIPELINE_BUBBLE, severity=Severity.WARNING, summary="bubble",
                    recommendation="more micro-batches", est_saving_ns=5 * MS,
                    evidence=BubbleEvidence(measured_bubble=0.4, saving_formula="x", recommended_microbatches=8))
    rows = analyze_recommendations([f_dp, f_str, f_own], None, None, None).section["recommendations"]
    assert [r["kind"] for r in rows] == ["unoverlapped_collective", "pipeline_bubble", "straggler"]
    assert [r["saving_formula"] for r in rows] == ["exposed", "x", ""]
    assert [r["explained_by"] for r in rows] == [None, None, None]
    assert rows[1]["recommendation"] == "more micro-batches"


def test_typed_evidence_is_checked_per_kind_and_flattens_to_the_json():
    with pytest.raises(TypeError, match="StragglerEvidence"):
        Finding(kind=FindingKind.STRAGGLER, severity=Severity.INFO, summary="x", evidence=Evidence())
    ev = StragglerEvidence.of({"cause": "compute", "delay_ns_per_step": 3, "last_count": 4})
    assert (ev.cause, ev.delay_ns_per_step, dict(ev.details)) == ("compute", 3, {"last_count": 4})
    with pytest.raises(TypeError):
        StragglerEvidence.of({"cause": "compute"})  # a number code reads may not go missing
    f = Finding(kind=FindingKind.STRAGGLER, severity=Severity.INFO, summary="x", evidence=ev)
    assert f.to_json()["evidence"] == {"cause": "compute", "delay_ns_per_step": 3, "last_count": 4}


def test_reconcile_marks_symptoms_of_pipeline_and_skew():
    pipe = PipelineResult(section={"source": "labels"})
    p2p = Finding(kind=FindingKind.UNOVERLAPPED_COLLECTIVE, severity=Severity.WARNING, summary="recv on pp",
                  ranks=(1,), dim="pp", recommendation="x", est_saving_ns=24 * MS,
                  evidence=CollectiveEvidence(op="recv", transfer_exposed_ns_per_step=0, share_of_step=0.0))
    tp = Finding(kind=FindingKind.UNOVERLAPPED_COLLECTIVE, severity=Severity.WARNING, summary="tp",
                 ranks=(0,), dim="tp", recommendation="y", est_saving_ns=3 * MS,
                 evidence=CollectiveEvidence(op="all_reduce", transfer_exposed_ns_per_step=0, share_of_step=0.0))
    skew = Finding(kind=FindingKind.EXPERT_ROUTING_SKEW, severity=Severity.CRITICAL, summary="skew",
                   ranks=(2,), dim="ep", recommendation="z", est_saving_ns=5 * MS, evidence=RoutingSkewEvidence(layer=0, expert=0, skew=2.0))
    late = Finding(kind=FindingKind.STRAGGLER, severity=Severity.CRITICAL, summary="late", ranks=(2,), dim="ep",
                   recommendation="w", est_saving_ns=9 * MS, evidence=StragglerEvidence(cause="compute", delay_ns_per_step=0))
    other = Finding(kind=FindingKind.STRAGGLER, severity=Severity.WARNING, summary="late", ranks=(3,), dim="ep",
                    recommendation="w", est_saving_ns=1 * MS, evidence=StragglerEvidence(cause="compute", delay_ns_per_step=0))
    out = reconcile([p2p, tp, skew, late, other], pipe)
    assert [f.summary for f in out][:3] == ["skew", "tp", "late"]
    by = {(f.summary, f.ranks): f for f in out}
    assert by[("recv on pp", (1,))].severity is Severity.INFO and by[("recv on pp", (1,))].est_saving_ns == 0
    assert by[("recv on pp", (1,))].evidence.original_est_saving_ns == 24 * MS
    assert by[("late", (2,))].evidence.explained_by.startswith("expert_routing_skew")
    assert by[("late", (3,))].severity is Severity.WARNING  # not the hot expert's owner
    assert by[("tp", (0,))].est_saving_ns == 3 * MS


def test_reconcile_pipeline_waits_and_slow_stage_straggler():
    pipe = PipelineResult(section={"source": "labels"})
    unov = UnoverlappedResult(section={"by_rank_dim_op": [
        {"rank": 1, "dim": "pp", "op": "recv", "transfer_exposed_ns": 80 * MS},
        {"rank": 1, "dim": "dp", "op": "all_reduce", "transfer_exposed_ns": 20 * MS},
        {"rank": 2, "dim": "pp", "op": "recv", "transfer_exposed_ns": 10 * MS},
        {"rank": 2, "dim": "tp", "op": "all_reduce", "transfer_exposed_ns": 30 * MS}]})
    imb = Finding(kind=FindingKind.PIPELINE_IMBALANCE, severity=Severity.WARNING, summary="imb", ranks=(0,),
                  dim="pp", recommendation="r", est_saving_ns=7 * MS, evidence=StageImbalanceEvidence(slowest_stage=0))
    bound1 = Finding(kind=FindingKind.COMMUNICATION_BOUND, severity=Severity.CRITICAL, summary="b1", ranks=(1,),
                     recommendation="r", est_saving_ns=80 * MS)
    bound2 = Finding(kind=FindingKind.COMMUNICATION_BOUND, severity=Severity.CRITICAL, summary="b2", ranks=(2,),
                     recommendation="r", est_saving_ns=40 * MS)
    late = Finding(kind=FindingKind.STRAGGLER, severity=Severity.CRITICAL, summary="late0", ranks=(0,), dim="dp",
                   recommendation="r", est_saving_ns=50 * MS, evidence=StragglerEvidence(cause="compute", delay_ns_per_step=0))
    out = {f.summary: f for f in reconcile([imb, bound1, bound2, late], pipe, None, unov)}
    assert out["b1"].est_saving_ns == 0 and "stage-to-stage" in out["b1"].evidence.explained_by  # 80% pp
    assert out["b2"].est_saving_ns == 40 * MS  # only 25% of its exposed time is pipeline waiting
    assert out["late0"].evidence.explained_by.startswith("pipeline_imbalance")
    assert reconcile([imb, bound1, bound2, late], pipe, None, unov)[0].summary == "b2"


def test_routing_skew_adds_all_to_all_of_busiest_rank():
    a = recommend.advise_routing_skew(layer=0, expert=3, skew=4.0, hot_rank_expert_ns=6 * MS,
                                      mean_rank_expert_ns=5 * MS, aux_loss_weight=None, capacity_factor=None,
                                      dropped_fraction=None, hot_rank_a2a_ns=40 * MS, recv_mean_over_max=0.75)
    assert a.saving_ns == pytest.approx(3 * 1 * MS + 40 * MS * 0.25)
    assert "a2a_hot" in a.evidence["saving_formula"]


def test_reconcile_attributes_exposed_comm_of_misplaced_groups():
    unov = UnoverlappedResult(section={"by_rank_dim_op": [
        {"rank": 0, "dim": "tp", "op": "all_reduce", "transfer_exposed_ns": 30 * MS},
        {"rank": 0, "dim": "dp", "op": "all_reduce", "transfer_exposed_ns": 10 * MS}]})
    place = Finding(kind=FindingKind.PLACEMENT_MISMATCH, severity=Severity.WARNING, summary="place", ranks=(0, 1),
                    dim="tp", recommendation="r", est_saving_ns=30 * MS, evidence=PlacementEvidence(exposed_ns_per_step=0))
    bound = Finding(kind=FindingKind.COMMUNICATION_BOUND, severity=Severity.CRITICAL, summary="bound", ranks=(0,),
                    recommendation="r", est_saving_ns=40 * MS)
    tp = Finding(kind=FindingKind.UNOVERLAPPED_COLLECTIVE, severity=Severity.WARNING, summary="tp", ranks=(0,),
                 dim="tp", recommendation="r", est_saving_ns=30 * MS, evidence=CollectiveEvidence(op="all_reduce", transfer_exposed_ns_per_step=0, share_of_step=0.0))
    dp = Finding(kind=FindingKind.UNOVERLAPPED_COLLECTIVE, severity=Severity.WARNING, summary="dp", ranks=(0,),
                 dim="dp", recommendation="r", est_saving_ns=10 * MS, evidence=CollectiveEvidence(op="all_reduce", transfer_exposed_ns_per_step=0, share_of_step=0.0))
    out = reconcile([place, bound, tp, dp], unoverlapped=unov)
    assert [f.summary for f in out][:2] == ["place", "dp"]
    assert {f.summary for f in out if f.evidence.explained_by} == {"bound", "tp"}


def test_reconcile_all_to_all_waiting_behind_routing_skew():
    unov = UnoverlappedResult(section={"by_rank_dim_op": [
        {"rank": 0, "dim": "ep", "op": "all_to_all", "transfer_exposed_ns": 60 * MS},
        {"rank": 0, "dim": "dp", "op": "all_reduce", "transfer_exposed_ns": 20 * MS}]})
    skew = Finding(kind=FindingKind.EXPERT_ROUTING_SKEW, severity=Severity.CRITICAL, summary="skew", ranks=(1,),
                   dim="ep", recommendation="r", est_saving_ns=30 * MS, evidence=RoutingSkewEvidence(layer=0, expert=0, skew=2.0))
    bound = Finding(kind=FindingKind.COMMUNICATION_BOUND, severity=Severity.CRITICAL, summary="bound", ranks=(0,),
                    recommendation="r", est_saving_ns=80 * MS)
    out = reconcile([skew, bound], unoverlapped=unov)
    assert out[0].summary == "skew" and out[1].evidence.explained_by.startswith("expert_routing_skew")
    # without a skew finding the same communication_bound stands
    assert reconcile([bound], unoverlapped=unov)[0].est_saving_ns == 80 * MS
