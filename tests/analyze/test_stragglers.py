"""Stragglers, matching and unoverlapped exposure on a hand-built 3-rank CPU run with known delays.

Every step is 10 ms. Ranks 0 and 1 compute 4 ms then issue an all-reduce; rank 2 computes 7 ms
(the straggler); the all-reduce ends for everyone 1 ms after the last arrival. So each instance has
skew 3 ms, transfer 1 ms, the late rank delays the group 3 ms per step (30% of the step), ranks 0
and 1 wait 3 ms and are exposed 4 ms of which 1 ms is transfer.
"""

from __future__ import annotations

import json

import jsonschema

from tracekit.flow import analyze_store

from tests.analyze.analyze_builders import build_store

MS = 1_000_000
STEP = 10 * MS


def scenario(tmp_path, *, slow_ops: int = 3, hosts=("h0", "h1", "h2"), late_rank: int = 2, view_ns: int = 10_000,
             late_busy_ns: int = 7 * MS, routed_tokens: dict[int, int] | None = None, second_op: bool = False,
             late_gap: bool = False, trace_kind: str = "cpu", gap_label: str | None = None):
    """`view_ns`: duration of the late rank's size-independent ops (the others' take 10 µs);
    `routed_tokens`: per rank, tokens its MoE router assigns per step (one layer, two experts);
    `second_op`: a second all-reduce per step (8.5 ms, rank 0 last by 0.1 ms, ends at 9 ms), so the late
    rank is last at only half of its collectives; `late_gap`: the late rank computes 4 ms like its peers
    and then nothing is recorded until it arrives (a sleep, or the process preempted); `gap_label`: that
    gap sits inside a user annotation of this name (a record_function label around the sleep)."""
    ranks, steps, events, coll, routing = [], [], [], [], []
    main, gloo = "thread 1 (python)", "thread 2 (pt_gloo_runloop)"
    for r in range(3):
        ranks.append({"rank": r, "world_size": 3, "hostname": hosts[r], "trace_kind": trace_kind,
                      "first_ts": 0, "last_ts": 4 * STEP})
        for s in range(4):
            base = s * STEP
            steps.append({"rank": r, "step": s, "ts": base, "dur": STEP})
            busy = late_busy_ns if r == late_rank else 4 * MS
            for e in range(2) if routed_tokens else ():
                routing.append({"rank": r, "step": s, "layer": 1, "expert": e, "tokens": routed_tokens[r] // 2})
            n_ops = slow_ops if r == late_rank else 1
            computed = 4 * MS if late_gap else busy
            for k in range(n_ops):
                events.append({"rank": r, "name": "aten::mm", "cat": "cpu_op", "tid": 1, "thread_name": main,
                               "ts": base + k * computed // n_ops, "dur": computed // n_ops, "step": s})
            if late_gap and gap_label and r == late_rank:
                events.append({"rank": r, "name": gap_label, "cat": "user_annotation", "tid": 1, "thread_name": main,
                               "ts": base + 4 * MS, "dur": busy - 4 * MS, "step": s})
            for k in range(2):  # size-independent ops, inside the compute
                events.append({"rank": r, "name": "aten::view", "cat": "cpu_op", "tid": 1, "thread_name": main,
                               "ts": base + 100_000 * (k + 1), "dur": view_ns if r == late_rank else 10_000,
                               "step": s})
            arrival, end = base + busy, base + 8 * MS
            events.append({"rank": r, "name": "gloo:all_reduce", "cat": "user_annotation", "tid": 2,
                           "thread_name": gloo, "ts": arrival, "dur": end - arrival, "step": s})
            common = {"rank": r, "pg_name": "g", "pg_desc": "mesh_dp", "op": "all_reduce", "group_ranks": [0, 1, 2],
                      "group_size": 3, "bytes": 4096, "step": s, "ts": arrival, "dur": end - arrival,
                      "enqueue_ts": arrival, "caller": "dp:grad_all_reduce"}
            coll.append({**common, "source": "comms-log", "seq": s + 1, "seq_source": "log"})
            coll.append({**common, "source": "kineto", "seq": None})
            if second_op:
                a2 = base + 8 * MS + MS // 2 + (MS // 10 if r == 0 else 0)
                common2 = {**common, "ts": a2, "enqueue_ts": a2, "dur": base + 9 * MS - a2}
                coll.append({**common2, "source": "comms-log", "seq": 100 + s, "seq_source": "log"})
        # a p2p op is never matched; a set-up barrier outside any step is not a straggler signal
        coll.append({"rank": r, "source": "comms-log", "pg_name": "g", "op": "send", "is_p2p": True, "seq": 1,
                     "ts": 50 * MS, "dur": MS, "enqueue_ts": 50 * MS})
        coll.append({"rank": r, "source": "comms-log", "pg_name": "g", "op": "barrier", "seq": 5,
                     "ts": 60 * MS + (30 * MS if r == 0 else 0), "dur": MS, "enqueue_ts": 60 * MS + (30 * MS if r == 0 else 0)})
    return build_store(tmp_path, {"ranks": ranks, "steps": steps, "events": events, "collectives": coll,
                                  **({"routing": routing} if routing else {}),
                                  "process_groups": [{"pg_name": "g", "pg_desc": "mesh_dp", "ranks": [0, 1, 2]}]})


def _find(a, kind):
    return [f for f in a["findings"] if f["kind"] == kind]


def test_matching_prefers_the_comms_log_and_measures_skew_and_transfer(tmp_path):
    a = analyze_store(scenario(tmp_path))
    m = a["sections"]["matching"]
    assert m["source"] == {"method": "uniform", "per_rank": {"0": "comms-log", "1": "comms-log", "2": "comms-log"}}
    assert m["p2p_skipped"] == 3 and m["instances"] == 5 and m["complete"] == 5
    (ar,) = [g for g in m["by_group"] if g["op"] == "all_reduce"]
    assert ar["dim"] == "dp" and ar["instances"] == 4
    assert ar["skew_ns"] == {"mean": 3 * MS, "p50": 3 * MS, "p95": 3 * MS, "max": 3 * MS}
    assert ar["transfer_ns"]["max"] == MS
    per = {p["rank"]: p for p in m["per_rank"]}
    assert per[2]["last_count"] == 4 and per[0]["wait_ns"] == 4 * 3 * MS


def test_straggler_is_named_with_its_delay_and_cause(tmp_path):
    a = analyze_store(scenario(tmp_path))
    top = a["findings"][0]
    assert top["kind"] == "straggler" and top["ranks"] == [2]
    assert top["est_saving_ns"] == 3 * MS          # 3 ms per step
    assert top["severity"] == "warning"            # 30%: above 25%, below 50%
    assert top["evidence"]["cause"] == "compute"
    assert top["evidence"]["op_count_ratio"] == round(5 / 3, 4)   # 3 mm + 2 views vs 1 mm + 2 views
    # the out-of-step barrier (rank 0 30 ms late) was left out
    assert a["sections"]["stragglers"]["excluded"]["outside_steps"] == 1
    assert not [f for f in _find(a, "straggler") if 0 in f["ranks"]]


def test_exposed_transfer_excludes_waiting_for_the_straggler(tmp_path):
    a = analyze_store(scenario(tmp_path))
    rows = {r["rank"]: r for r in a["ranks"]}
    assert rows[0]["exposed_comm_ns"] == 4 * 4 * MS and rows[2]["exposed_comm_ns"] == 4 * MS
    (dp,) = a["sections"]["unoverlapped"]["by_dim_op"]
    assert dp["dim"] == "dp" and dp["op"] == "all_reduce" and dp["overlap_ratio"] == 0.0
    assert dp["exposed_ns_per_step"] == 4 * MS and dp["transfer_exposed_ns_per_step"] == MS
    (f,) = _find(a, "unoverlapped_collective")
    assert f["dim"] == "dp" and f["est_saving_ns"] == MS and f["severity"] == "warning"  # 10%, never overlapped
    sizes = a["sections"]["unoverlapped"]["by_size"]
    assert sizes[0]["key"] == "1KiB-64KiB" and sizes[0]["instances"] == 12
    (caller,) = a["sections"]["unoverlapped"]["by_caller"]
    assert caller["key"] == "dp:grad_all_reduce" and caller["exposed_ns"] == 4 * (4 + 4 + 1) * MS


def test_same_ops_slower_on_one_host_is_contention_with_a_caveat_not_a_cap(tmp_path):
    # same op count, and even its views run 3x slower: the host is slow, not the work bigger. The
    # rank still holds its peers back 3 ms per step: a straggler at full severity, its delay the
    # saving; the shared host is a caveat on the cause, never a cap (issue 12)
    a = analyze_store(scenario(tmp_path, slow_ops=1, hosts=("vm", "vm", "vm"), view_ns=30_000))
    (f,) = _find(a, "straggler")
    assert f["ranks"] == [2] and f["evidence"]["cause"] == "contention" and f["severity"] == "warning"
    assert f["evidence"]["shape_free_op_slowdown"] == 3.0 and f["evidence"]["op_count_ratio"] == 1.0
    assert "severity_capped" not in f["evidence"] and f["est_saving_ns"] == 3 * MS
    assert "one host" in f["evidence"]["caveat"]
    assert a["sections"]["clocks"]["method"] == "same-host"
    # on separate hosts the same delay keeps its severity
    b = analyze_store(scenario(tmp_path / "b", slow_ops=1, view_ns=30_000))
    (g,) = _find(b, "straggler")
    assert g["evidence"]["cause"] == "contention" and g["severity"] == "warning"


def test_same_ops_on_bigger_inputs_is_compute_not_contention(tmp_path):
    # same op count but views at normal speed: the mm itself is bigger (e.g. longer sequences)
    a = analyze_store(scenario(tmp_path, slow_ops=1, hosts=("vm", "vm", "vm")))
    (f,) = _find(a, "straggler")
    assert f["evidence"]["cause"] == "compute" and f["evidence"]["shape_free_op_slowdown"] == 1.0
    assert f["severity"] == "warning" and f["est_saving_ns"] == 3 * MS


def test_same_ops_on_equal_counted_work_is_contention_even_with_normal_speed_views(tmp_path):
    # as above (same ops, views at normal speed: timing alone cannot tell bigger work from a slower
    # host), but the router assigned every rank the same tokens: the work is counted equal, so the
    # longer compute is the host's, not the inputs' (a clean 2-rank run on the shared box looks so)
    a = analyze_store(scenario(tmp_path, slow_ops=1, hosts=("vm", "vm", "vm"),
                               routed_tokens={0: 256, 1: 256, 2: 256}))
    (f,) = _find(a, "straggler")
    assert f["ranks"] == [2] and f["evidence"]["cause"] == "contention"
    assert f["evidence"]["counted_work_equal"] is True and f["evidence"]["shape_free_op_slowdown"] == 1.0
    assert f["severity"] == "warning" and f["est_saving_ns"] == 3 * MS  # one host: a caveat, not a cap
    assert "caveat" in f["evidence"]
    # the same on separate hosts keeps its severity (a noisy neighbour or a throttled device there)
    b = analyze_store(scenario(tmp_path / "b", slow_ops=1, routed_tokens={0: 256, 1: 256, 2: 256}))
    (g,) = _find(b, "straggler")
    assert g["evidence"]["cause"] == "contention" and g["severity"] == "warning"


def test_unrecorded_gaps_on_cpu_ranks_sharing_one_host_are_a_straggler_with_a_caveat(tmp_path):
    # same ops, same compute, then 3 ms with nothing recorded before it arrives: host idle
    a = analyze_store(scenario(tmp_path, slow_ops=1, late_gap=True, hosts=("vm", "vm", "vm")))
    (f,) = _find(a, "straggler")
    assert f["ranks"] == [2] and f["evidence"]["cause"] == "host_idle"
    # 3 ms at each examined instance (the first step's has no earlier collective to measure from)
    assert f["evidence"]["host_idle_excess_ns"] == f["evidence"]["instances_examined"] * 3 * MS > 0
    # CPU-only ranks on one host's cores: preemption leaves the same gaps as a sleep, which the caveat
    # says; the rank holds its peers back all the same (no cap, its delay is the saving; the critical-path
    # replay may refine est_saving_ns and keeps the analyzer's figure as closed_form_saving_ns)
    assert f["severity"] == "warning" and f["evidence"].get("closed_form_saving_ns", f["est_saving_ns"]) == 3 * MS
    assert "severity_capped" not in f["evidence"] and "one host" in f["evidence"]["caveat"]
    # the same gap is rank 2's host stall (3 ms + the 2 ms every rank idles after the all-reduce ends at
    # 8 ms), with the same caveat and no cap
    (h,) = [h for h in _find(a, "idle_host_bound") if h["ranks"] == [2]]
    assert h["evidence"]["stall_ns"] == 3 * MS + (STEP - 8 * MS) and h["evidence"]["cause"] == "host_gap"
    assert h["severity"] == "critical" and "one host" in h["evidence"]["caveat"]
    # on separate hosts, or with devices doing the compute, the gap is the rank's own: a warning
    for kw in ({"hosts": ("h0", "h1", "h2")}, {"hosts": ("vm", "vm", "vm"), "trace_kind": "gpu"}):
        b = analyze_store(scenario(tmp_path / kw.get("trace_kind", "hosts"), slow_ops=1, late_gap=True, **kw))
        (g,) = _find(b, "straggler")
        assert g["evidence"]["cause"] == "host_idle" and g["severity"] == "warning"
        assert g["evidence"].get("closed_form_saving_ns", g["est_saving_ns"]) == 3 * MS
        assert all("caveat" not in h["evidence"] for h in _find(b, "idle_host_bound")) is ("h0" in kw["hosts"])


def test_a_sleep_inside_any_label_or_none_is_the_same_straggler_and_host_stall(tmp_path):
    """Rank 2 computes 4 ms like its peers, then sleeps until it arrives at 7 ms: inside our runtime's
    `data:load` label, inside a user's `my_fetch`, or with no label. A label is no host activity and
    only names what the idle time was: every finding is the same but for the label named."""
    peers_arrive, late_arrives, coll_end = 4 * MS, 7 * MS, 8 * MS  # scenario(): every step, on each rank

    def label_free(f):
        ev = {k: v for k, v in f["evidence"].items() if k not in ("idle_labels", "stall_labels")}
        return {**f, "summary": None, "evidence": ev}

    runs = {}
    for label in ("data:load", "my_fetch", None):
        a = analyze_store(scenario(tmp_path / str(label), slow_ops=1, late_gap=True, gap_label=label))
        runs[label] = [label_free(f) for f in a["findings"]]
        (f,) = _find(a, "straggler")
        row = next(r for r in a["sections"]["stragglers"]["ranks"] if r["rank"] == 2)
        assert f["ranks"] == [2] and row["delay_ns_per_step"] == late_arrives - peers_arrive
        assert f["evidence"]["cause"] == "host_idle" and f["evidence"]["data_load_excess_ns"] == 0
        examined = f["evidence"]["instances_examined"]
        assert f["evidence"]["idle_labels"] == ({label: examined * (late_arrives - peers_arrive)} if label else {})
        assert (f"cause: host idle inside the label {label!r}" in f["summary"]) is (label is not None)
        # host stalls: the sleep, and the 2 ms after the all-reduce ends that every rank idles
        stalls = {r["rank"]: r for r in a["sections"]["host_stalls"]["ranks"]}
        assert stalls[2]["stall_ns"] == (late_arrives - peers_arrive) + (STEP - coll_end)
        assert stalls[2]["data_load_ns"] == 0
        assert stalls[2]["stall_labels"] == ({label: late_arrives - peers_arrive} if label else {})
        assert [s["stall_ns"] for s in stalls.values() if s["rank"] != 2] == [STEP - coll_end] * 2
    assert runs["data:load"] == runs["my_fetch"] == runs[None]
    assert [f["ranks"] for f in runs[None] if f["kind"] == "idle_host_bound"]  # found from the trace alone


def test_same_ops_on_more_routed_tokens_is_uneven_work_and_warns_below_the_noise_floor(tmp_path):
    # 1.5 ms late per 10 ms step (15%: below the 25% timing-noise floor), its views even 3x slower
    # (timing says "contention"), but its router assigned 2x the peers' tokens: counted, so uneven work
    kw = dict(slow_ops=1, hosts=("vm", "vm", "vm"), view_ns=30_000, late_busy_ns=5_500_000)
    a = analyze_store(scenario(tmp_path, **kw, routed_tokens={0: 256, 1: 256, 2: 512}))
    (f,) = _find(a, "straggler")
    assert f["ranks"] == [2] and f["evidence"]["cause"] == "uneven_work" and f["severity"] == "warning"
    assert f["evidence"]["work_ratio"] == 2.0 and f["evidence"]["work_measure"] == "routed_tokens"
    assert f["est_saving_ns"] == 1_500_000 and "sequences" in f["recommendation"]
    # the same timings with equal token counts: timing evidence only, contention on one host, info
    b = analyze_store(scenario(tmp_path / "b", **kw, routed_tokens={0: 256, 1: 256, 2: 256}))
    (g,) = _find(b, "straggler")
    assert g["evidence"]["cause"] == "contention" and g["evidence"]["work_ratio"] == 1.0
    assert g["severity"] == "info"


def test_analysis_json_validates_against_the_schema(tmp_path):
    from importlib import resources

    schema = json.loads(resources.files("tracekit").joinpath("schemas/analysis.schema.json").read_text())
    a = json.loads(json.dumps(analyze_store(scenario(tmp_path))))
    jsonschema.validate(a, schema)
    assert {f["severity"] for f in a["findings"]} <= {"info", "warning", "critical"}
    savings = [f["est_saving_ns"] for f in a["findings"]]
    assert savings == sorted(savings, reverse=True)


def test_counted_extra_ops_warn_although_the_rank_is_last_at_only_half_its_collectives(tmp_path):
    # rank 2 is last at the 4 slow all-reduces, rank 0 at the 4 extra ones: half of rank 2's collectives,
    # under the 75% last-share guard, but it runs more ops than its peers (counted work, not timing noise)
    a = analyze_store(scenario(tmp_path / "more_ops", second_op=True))
    (f,) = _find(a, "straggler")
    assert f["ranks"] == [2] and f["evidence"]["cause"] == "compute"
    assert f["evidence"]["last_count"] == 4 and f["evidence"]["instances"] == 8
    assert f["evidence"]["last_share"] == 0.5 and f["evidence"]["last_chance"] == round(1 / 3, 4)
    # 3 mm + 2 views per step against 1 mm + 2 views; 3 ms of a 10 ms step
    assert f["evidence"]["op_count_ratio"] == round(5 / 3, 4) and f["severity"] == "warning"
    # the same delay with the same ops as its peers has no counted evidence: the last-share guard holds
    b = analyze_store(scenario(tmp_path / "same_ops", second_op=True, slow_ops=1))
    (g,) = _find(b, "straggler")
    assert g["ranks"] == [2] and g["evidence"]["op_count_ratio"] == 1.0 and g["severity"] == "info"


def _dominance_by_definition(members: dict[str, list[int]], last: dict[str, int], delay: dict[str, int],
                             total: dict[int, int], steps: int) -> dict[int, dict]:
    """The section's dominance, late_with and last_share_with by their documented definition, instance by
    instance in plain Python."""
    out = {}
    for r in total:
        mine = [k for k, m in members.items() if r in m]
        peers = sorted({p for k in mine for p in members[k] if p != r})

        def held(a: int, b: int) -> int:
            return sum(delay[k] for k, m in members.items() if a in m and last[k] == b)

        together = [p for p in peers if total[r] > 0 and min(total[r], total[p]) > 0
                    and 2 * min(total[r], total[p]) >= max(total[r], total[p])
                    and 2 * (held(r, p) + held(p, r)) < min(total[r], total[p]) * steps]
        nxt = max((total[p] for p in peers if p not in together), default=0)
        got = {"dominance": round(total[r] / nxt, 3) if nxt > 0 else None}
        if together:
            got["late_with"] = together
            got["last_share_with"] = round(sum(last[k] in (r, *together) for k in mine) / len(mine), 4)
        out[r] = got
    return out


def test_dominance_and_late_with_follow_their_definition() -> None:
    """Random collectives over tensor-parallel pairs, data-parallel rows and the world: each rank's dominance,
    the peers it is late with and its last share with them as the definition gives them (plain Python over
    the instances), whatever the set-up; ranks given close delays make late_with pairs of every kind."""
    import random

    import numpy as np
    import pandas as pd

    from tracekit.analyze.stragglers import _set_dominance
    from tracekit.derive.matching import MatchedCollectives

    paired = 0
    for seed in range(12):
        rng = random.Random(seed)
        world = list(range(12))
        groups = [[2 * i, 2 * i + 1] for i in range(6)] + [world[i::4] for i in range(4)] + [world]
        members, last, delay = {}, {}, {}
        for i in range(rng.randrange(20, 60)):
            g = rng.choice(groups[:-1] if seed % 3 == 0 else groups)
            members[f"k{i}"], last[f"k{i}"] = g, rng.choice(g)
            delay[f"k{i}"] = rng.choice([0, 5, 40, 300, 2_000])
        ranks = sorted({r for m in members.values() for r in m})
        total = {r: rng.choice([0, 0, 100, 150, 190, 400, 900]) for r in ranks}
        steps = rng.choice([1, 2, 3])
        rows = pd.DataFrame([{"key": k, "rank": r} for k, m in members.items() for r in m])
        inst = pd.DataFrame({"key": list(members), "last_rank": [last[k] for k in members],
                             "delay": np.array([delay[k] for k in members], np.int64)})
        matched = MatchedCollectives(rows, inst, {}, {})
        got = [{"rank": r, "delay_ns_per_step": t} for r, t in sorted(total.items(), key=lambda x: -x[1])]
        _set_dominance(matched, got, steps)
        want = _dominance_by_definition(members, last, delay, total, steps)
        assert {row["rank"]: {k: row[k] for k in ("dominance", "late_with", "last_share_with") if k in row}
                for row in got} == want, seed
        paired += sum("late_with" in row for row in got)
    assert paired >= 12  # the pairs the rule is about do occur
