"""The replay's inputs taken from the derived facts, and the replay of a run's last steps.

`step_input` gathers what the graph builder (whatif/build.py) reads — matched collectives, the group →
dim map, each rank's send/recv rows and collective ends —, `run_layout` the layout the fixes act on
(mesh coordinates, hosts, pipeline stages), and `replay_steps` builds and replays the last `MAX_STEPS`
steps as one graph: the steps the breakdown analyses (`analysed_steps`: ProfilerStep windows, iterations
found where a trace without them repeats, or a rank's one window as one step: a GPU rank's first to last
device event, a CPU rank's first to last event). The
critical path (assess/critical_path.py), `tracekit whatif` (assess/whatif.py) and the explained diff
(compare/attribution.py) all start here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tracekit.derive.activity import rank_activities, stepless_window
from tracekit.derive.host_ops import SlowOps
from tracekit.derive.matching import (MatchingResult, choose_sources, gpu_ranks, log_only_ranks, matched_of,
                                      read_collectives)
from tracekit.derive.topology import LayoutResult, cpu_hosts, dims_of, rank_hosts
from tracekit.layout import rank_to_host
from tracekit.findings.result import AnalyzerResult, section_of
from tracekit.tables.columns import Columns, arrow_columns, first_of_group, group_ids, strings, take
from tracekit.tables.store import RunStore
from tracekit.whatif.build import SPAN_STEP, StepInput, build_step_graph
from tracekit.whatif.fixes import RunFacts
from tracekit.whatif.replay import StepResult, replay_steps_of

MAX_STEPS = 8
"""Steps analyzed (the last ones; the first profiled step is often a warm-up)."""


def step_input(store: RunStore, layout: LayoutResult | None, matching: MatchingResult | None,
               slow_ops: SlowOps | None = None) -> StepInput:
    """Matched collectives, dims and send/recv rows (each rank's matching source) for the builder, with the
    host_bound analyzer's slow host ops where it ran (`slow_ops`)."""
    p2p = ends = None
    if store.has("collectives"):
        cols = arrow_columns(read_collectives(store))
        ends = collective_ends(cols)
        p2p = p2p_rows(cols)
    return StepInput(matched=matched_of(matching), dims=dims_of(layout), p2p=p2p, ends=ends, slow_ops=slow_ops)


def p2p_rows(cols: Columns) -> Columns | None:
    """The send/recv rows of the collectives table `cols` from each rank's matching source, None if none."""
    is_p2p = cols["is_p2p"] | np.isin(strings(cols["op"]), ["send", "recv"])
    if not is_p2p.any():
        return None
    per_rank, _ = choose_sources(cols)
    # the timed send/recv rows' sources grouped by rank once (a scan of every row per rank was quadratic in
    # ranks: 64 of 76 CPU-seconds of a 1,024-rank analysis)
    timed = np.flatnonzero(is_p2p & cols["ts_ok"] & cols["dur_ok"])
    t_rank, t_src = cols["rank"][timed], strings(cols["source"][timed])
    order = np.argsort(t_rank, kind="stable")
    t_rank, t_src = t_rank[order], t_src[order]
    cut = np.flatnonzero(np.r_[True, t_rank[1:] != t_rank[:-1], True]) if t_rank.size else np.zeros(1, np.int64)
    sources = {int(t_rank[a]): t_src[a:b] for a, b in zip(cut[:-1].tolist(), cut[1:].tolist())}
    per_rank = {r: timed_p2p_source(sources.get(int(r), t_src[:0]), s) for r, s in per_rank.items()}
    chosen = np.array([per_rank.get(r) for r in cols["rank"].tolist()], dtype=object)
    keep = is_p2p & (cols["source"] == chosen)
    return take(cols, keep) if keep.any() else None


def timed_p2p_source(sources: np.ndarray, chosen: str) -> str:
    """The source of a rank's send/recv rows (`sources`: the sources of its timed send/recv rows): its
    matching source `chosen` where that one times them, else the source timing most of them (a comms log
    holds enqueue times only; the profiler's ops on the same rank carry start and end, which the replay's
    send/recv links need)."""
    if not sources.size or (sources == chosen).any():
        return chosen
    names, counts = np.unique(sources, return_counts=True)
    return str(names[np.argmax(counts)])


def collective_ends(cols: Columns) -> Columns | None:
    """Per (rank, pg_name, seq): the latest trace-clock end `trace_end` (ts + dur) any source records (a
    comms log holds enqueue times only; the profiler's op or kernel on the same rank gives the end)."""
    ok = cols["ts_ok"] & cols["dur_ok"] & cols["seq_ok"] & np.array([p is not None for p in cols["pg_name"]], bool)
    if not ok.any():
        return None
    c = take(cols, ok)
    pg = strings(c["pg_name"])
    code, n = group_ids(c["rank"], pg, c["seq"])
    end = np.full(n, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(end, code, c["ts"] + c["dur"])
    first = first_of_group(code, n)
    return {"rank": c["rank"][first], "pg_name": pg[first], "seq": c["seq"][first], "trace_end": end}


def run_layout(layout: LayoutResult | None, pipeline: AnalyzerResult | None, store: RunStore | None = None) -> RunFacts:
    lay = section_of(layout)
    pipe = section_of(pipeline)
    coords = {int(r["rank"]): dict(r.get("coords") or {}) for r in lay.get("ranks", [])}
    return RunFacts(coords=coords, cpu_hosts=cpu_hosts(store), hosts=rank_hosts(store), pp=int(pipe.get("num_stages") or (lay.get("mesh_shape") or {}).get("pp") or 1),
                  microbatches=pipe.get("num_microbatches"), virtual_stages=int(pipe.get("chunks_per_rank") or 1),
                  stages=pipeline_stages(pipe), **host_cores(store))


def host_cores(store: RunStore | None) -> dict[str, Any]:
    """`RunFacts.cores` (host → the fewest `host_cpus` of its ranks), `RunFacts.cpu_wait` (rank →
    `cpu_wait_share`) and `RunFacts.cpu_runnable` (rank → `cpu_runnable_ns`), where the ranks table records them."""
    if store is None or not store.has("ranks"):
        return {}
    t = store.table("ranks", ["rank", "hostname", "host_cpus", "cpu_wait_share", "cpu_runnable_ns"]).to_pylist()
    hosts = rank_to_host(None, t)
    cores: dict[str, int] = {}
    for r in t:
        h = hosts.get(int(r["rank"]))
        if h is not None and r["host_cpus"]:
            cores[h] = min(cores.get(h, int(r["host_cpus"])), int(r["host_cpus"]))
    wait = {int(r["rank"]): float(r["cpu_wait_share"]) for r in t if r["cpu_wait_share"] is not None}
    runnable = {int(r["rank"]): float(r["cpu_runnable_ns"]) for r in t if r["cpu_runnable_ns"] is not None}
    return {"cores": cores, "cpu_wait": wait, "cpu_runnable": runnable}


def pipeline_stages(pipe: dict[str, Any]) -> dict[int, int]:
    """rank → its stage: its position in its pipeline's ranks (the pipeline section's, from the P2P graph)."""
    return {int(r): i for p in pipe.get("pipelines") or [] for i, r in enumerate(p.get("ranks") or [])}


def analysed_steps(store: RunStore) -> tuple[tuple[int, ...], set[int] | None, str]:
    """The steps the replay analyses (the last MAX_STEPS), the ranks it analyses them on (None: every
    rank) and the rule that found them, the breakdown's (derive/activity.py `_windows`): the steps table's
    (`steps.rule`: profiler_step, or optimizer_step | graph_launch | repeated_ops, the iterations where a
    trace without ProfilerStep repeats); on a run without steps, each rank's one window (derive/activity.py
    `stepless_window`: a GPU rank's first to last device event, `device_span`; a CPU rank's first to last event,
    `trace`) as one step, SPAN_STEP. ((), None, "none") when there is neither (no rank with events)."""
    if store.has("steps"):
        cols = ["step"] + (["rule"] if "rule" in store.columns("steps") else [])
        t = store.table("steps", cols)
        steps = sorted(set(t.column("step").to_pylist()))
        if steps:
            rules = sorted({r for r in t.column("rule").to_pylist() if r}) if "rule" in cols else []
            return tuple(int(s) for s in steps[-MAX_STEPS:]), None, ", ".join(rules) or "profiler_step"
    acts = rank_activities(store, None)
    span = {r: acts.get(r).step_rule for r in store.ranks() if stepless_window(acts.get(r)) is not None}
    return ((SPAN_STEP,), set(span), ", ".join(sorted(set(span.values())))) if span else ((), None, "none")


def replay_steps(store: RunStore, inp: StepInput) -> list[StepResult]:
    """The last MAX_STEPS steps (`analysed_steps`) as one graph (a fix that shortens a step lets the next
    begin earlier), one result per step, each carrying the rule that found the steps."""
    steps, span_ranks, rule = analysed_steps(store)
    if not steps:
        return []
    # log-only ranks (a partial recording) of a GPU run are chains of their logged collectives: work between
    # them, then each arrival (build.add_log_rank), so a fix on one of them (a slow GPU no trace covers) is
    # replayed. Their logs time the device (matching.gpu_ranks); a CPU run's logs time the host's enqueue and
    # completion, which the chain does not model: there the graph is the traced ranks'
    log_only = log_only_ranks(store)
    chained = log_only if log_only and log_only <= gpu_ranks(store) else set()
    ranks = [r for r in store.ranks() if r not in log_only or r in chained] if log_only else None
    if span_ranks is not None:
        ranks = [r for r in (store.ranks() if ranks is None else ranks) if r in span_ranks]
    g = build_step_graph(store, steps, inp, ranks, log_only=chained)
    return replay_steps_of(g, rule) if g.ranks.size else []
