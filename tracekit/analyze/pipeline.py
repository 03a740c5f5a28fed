"""Pipeline parallelism: per stage/micro-batch phase times, stage imbalance, measured vs theoretical bubble.

Definitions (DESIGN §3). A *pipeline* is one pp process group (one rank per stage; one per data-parallel
replica). Per pipeline and step, the *schedule window* runs from the first compute phase start to the
last compute phase end over the pipeline's ranks (clocks aligned with `ranks.clock_offset_ns`):
    stage bubble  = 1 − busy(rank) / window      busy = union of the rank's fwd/bwd/bwd_input/bwd_weight
    bubble        = mean stage bubble over the pipeline's ranks
which is exactly `(p−1)/(m+p−1)` for GPipe/1F1B with equal stage times and free p2p, and
`(p−1)/(v·m+p−1)` for interleaved schedules with v chunks per rank (also used for zero-bubble
schedules, where it is an upper bound: they fill part of it with weight-gradient work). Imbalance = slowest stage compute /
mean stage compute (stage compute = summed phase durations per step). The window excludes the
optimizer, data loading and gradient sync; `bubble_of_step` reports the same idle time over the step.
A `pipeline_bubble` finding's severity: from what more micro-batches would save where the schedule has
fewer micro-batches than stages (m < p: the pipeline never fills, the "too few micro-batches" fault);
with m ≥ p the bubble the schedule implies is the configuration working as designed, so the severity
comes from the idle beyond it only (`excess_over_schedule_ns` = (measured − theoretical) × window).

With no `pipeline` rows (unlabelled traces) the stages come from the pp groups and the send/recv
structure: the idle time is the p2p time not covered by anything else on the rank (`source: "p2p"`).

Section `pipeline` (JSON):
{
  "source": "labels" | "p2p" | null,     # null: no pipeline parallelism found
  "schedule": str | null,                # manifest's, else detected: gpipe | 1f1b | interleaved | zb
  "schedule_detected": str | null,       # from phase order (labels only)
  "num_stages": p, "chunks_per_rank": v, "num_microbatches": m,
  "microbatches_source": str | null,     # p2p source only: "manifest" | "sends of the first stage"
  "theoretical_bubble": float | null,    # (p−1)/(v·m+p−1)
  "measured_bubble": float | null,       # mean over pipelines and steps
  "imbalance": float | null,             # slowest / mean stage compute
  "stages": [{"stage", "ranks": [..], "compute_ns", "fwd_ns", "bwd_ns", "layers": int | null}],
  "pipelines": [{"ranks": [..], "steps": [{"step", "window_ns", "bubble",
                 "ranks": [{"rank", "stage_ids": [..], "busy_ns", "bubble", "bubble_of_step",
                            "p2p_ns", "p2p_wait_ns"}]}]}],
  "per_microbatch": [{"stage", "microbatch", "phase", "mean_ns"}],     # mean over steps and replicas
  "diagram": {"step", "ranks": [..], "window_ns",                       # one step of pipeline 0
              "intervals": [{"rank", "stage", "microbatch", "phase", "start_ns", "dur_ns"}]}
}
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.config import AnalysisConfig
from tracekit.derive import intervals as iv
from tracekit.derive.pipeline_graph import InferredPipeline, P2POp, infer_pipelines, load_p2p
from tracekit.findings import recommend
from tracekit.findings.evidence import BubbleEvidence, StageImbalanceEvidence
from tracekit.findings.finding import Finding, FindingKind, Severity
from tracekit.findings.result import AnalyzerResult
from tracekit.parse.dict_columns import text_test
from tracekit.tables.columns import table_rows
from tracekit.tables.store import RunStore

COMPUTE_PHASES = ("fwd", "bwd", "bwd_input", "bwd_weight")
BWD_PHASES = ("bwd", "bwd_input", "bwd_weight")

IMBALANCE_WARNING = 1.2
"""Slowest/mean stage compute at which imbalance is a warning (critical at IMBALANCE_CRITICAL), provided
the re-split would save at least IMBALANCE_MIN_SAVING of the step."""
IMBALANCE_CRITICAL = 1.6
IMBALANCE_MIN_SAVING = 0.05
"""A re-split must save at least this share of the step for imbalance to be more than info."""
SAVING_WARNING = 0.10
"""Estimated saving / step time at which a bubble finding is a warning (critical at SAVING_CRITICAL)."""
SAVING_CRITICAL = 0.30


def theoretical_bubble(p: int, m: int, v: int = 1) -> float:
    """Bubble fraction of GPipe/1F1B ((p−1)/(m+p−1)) and interleaved with v chunks ((p−1)/(v·m+p−1))."""
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"need p, m, v >= 1, got p={p} m={m} v={v}")
    return (p - 1) / (v * m + p - 1)


def _clock_offsets(store: RunStore) -> dict[int, int]:
    t = store.table("ranks", ["rank", "clock_offset_ns"]).to_pylist()
    return {r["rank"]: int(r["clock_offset_ns"] or 0) for r in t}


def _pp_groups(store: RunStore) -> list[list[int]]:
    """Rank lists of the pp process groups (dim column, else pg_desc naming pp, else the manifest's layout)."""
    out = []
    layout = (store.manifest or {}).get("layout")
    if isinstance(layout, dict) and isinstance(layout.get("groups"), dict):
        for ranks in layout["groups"].get("pp") or []:
            if len(ranks) > 1 and list(ranks) not in out:
                out.append([int(r) for r in ranks])
    for g in store.table("process_groups", ["pg_desc", "ranks", "dim"]).to_pylist():
        desc = (g["pg_desc"] or "").lower()
        if g["dim"] == "pp" or desc in ("mesh_pp", "pp"):
            ranks = list(g["ranks"] or [])
            if len(ranks) > 1 and ranks not in out:
                out.append(ranks)
    return out


def _manifest_pipeline(store: RunStore) -> dict[str, Any]:
    """Schedule facts the manifest states (runtime config or `tracekit record` layout), if any."""
    man = store.manifest or {}
    cfg = man.get("config") if isinstance(man.get("config"), dict) else {}
    layout = man.get("layout") if isinstance(man.get("layout"), dict) else {}

    def pick(*keys: str) -> Any:
        for k in keys:  # earlier keys win over later ones, then manifest top level over layout over config
            for src in (man, layout, cfg):
                if src.get(k) is not None:
                    return src[k]
        return None

    schedule = pick("schedule_effective", "schedule")
    return {
        "schedule": schedule if isinstance(schedule, str) else None,  # `tracekit record`'s is the profiler's
        "microbatches": pick("microbatches", "num_microbatches"),
        "virtual_stages": pick("virtual_stages", "chunks_per_rank"),
        "stage_layers": pick("stage_layers"),
        "num_layers": pick("num_layers") or ((cfg.get("model") or {}).get("num_layers") if cfg else None),
        "pp": pick("pp"),
        "dp": pick("dp"),
        "global_batch_size": pick("global_batch_size"),
    }


def _detect_schedule(rows: list[dict[str, Any]], v: int) -> str:
    """gpipe when every rank runs all its forwards before any backward; zb with split backward."""
    phases = {r["phase"] for r in rows}
    if "bwd_weight" in phases or "bwd_input" in phases:
        return "zb"
    if v > 1:
        return "interleaved"
    by_rank_step: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_rank_step[(r["rank"], r["step"])].append(r)
    for evs in by_rank_step.values():
        fwd = [e["ts"] for e in evs if e["phase"] == "fwd"]
        bwd = [e["ts"] for e in evs if e["phase"] in BWD_PHASES]
        if fwd and bwd and min(bwd) < max(fwd):
            return "1f1b"
    return "gpipe"


@dataclass(frozen=True)
class PipelineResult(AnalyzerResult):
    @property
    def labelled(self) -> bool:
        """Stages and phases came from the runtime's labels (the `pipeline` table)."""
        return (self.section or {}).get("source") == "labels"


def analyze_pipeline(store: RunStore, config: AnalysisConfig) -> PipelineResult:
    """Pipeline section and `pipeline_bubble` / `pipeline_imbalance` findings."""
    rows = table_rows(store.table("pipeline"))
    rows = [r for r in rows if r["step"] is not None and r["dur"] is not None and r["dur"] >= 0]
    if rows:
        return _from_labels(store, config, rows)
    return _from_p2p(store, config)


def _empty_section() -> dict[str, Any]:
    return {"source": None, "schedule": None, "schedule_detected": None, "num_stages": 0,
            "chunks_per_rank": 0, "num_microbatches": 0, "theoretical_bubble": None,
            "measured_bubble": None, "imbalance": None, "stages": [], "pipelines": [],
            "per_microbatch": [], "diagram": None}


def _step_windows(store: RunStore, offsets: dict[int, int]) -> dict[tuple[int, int], tuple[int, int]]:
    out = {}
    for s in store.table("steps", ["rank", "step", "ts", "dur"]).to_pylist():
        if s["dur"] is not None:
            t0 = s["ts"] - offsets.get(s["rank"], 0)
            out[(s["rank"], s["step"])] = (t0, t0 + s["dur"])
    return out


def _p2p_intervals(store: RunStore, offsets: dict[int, int]) -> dict[tuple[int, int], iv.IntervalSet]:
    """Union of send/recv intervals per (rank, step)."""
    t = store.table("collectives", ["rank", "step", "is_p2p", "op", "ts", "dur"])
    t = t.filter(pc.or_(pc.fill_null(t["is_p2p"], False),
                        pc.fill_null(pc.is_in(t["op"], pa.array(["send", "recv"])), False)))
    acc: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for c in table_rows(t):
        p2p = c["is_p2p"] or c["op"] in ("send", "recv")
        if not p2p or c["ts"] is None or c["dur"] is None or c["step"] is None:
            continue
        t0 = c["ts"] - offsets.get(c["rank"], 0)
        acc[(c["rank"], c["step"])].append((t0, t0 + c["dur"]))
    return {k: iv.union([a for a, _ in v], [b for _, b in v]) for k, v in acc.items()}


def _labelled_pipelines(store: RunStore, compute: list[dict[str, Any]], stage_ranks: dict[int, set[int]],
                        inferred: list[InferredPipeline]) -> list[list[int]]:
    """Who forms a pipeline: the p2p graph first, pp-named groups where it shows none, else one
    pipeline per replica (the i-th rank of every stage together)."""
    pipelines = [x.ranks for x in inferred] or _pp_groups(store)
    label_ranks = sorted({r["rank"] for r in compute})
    pipelines = [g for g in pipelines if set(g) & set(label_ranks)]
    if not pipelines:
        per_stage = [sorted(stage_ranks[s]) for s in sorted(stage_ranks)]
        n_rep = min(len(x) for x in per_stage)
        pipelines = [sorted({x[i] for x in per_stage}) for i in range(n_rep)]
    return pipelines


def _labelled_step(ranks: list[int], step: int, by_rank_step: dict[tuple[int, int], list[dict[str, Any]]],
                   windows: dict[tuple[int, int], tuple[int, int]],
                   p2p: dict[tuple[int, int], iv.IntervalSet]) -> dict[str, Any] | None:
    """One step of one pipeline: each rank's busy time and bubble in the pipeline's window."""
    evs = [e for rk in ranks for e in by_rank_step.get((rk, step), [])]
    if not evs or len({e["rank"] for e in evs}) < len(ranks):
        return None  # a rank of this pipeline has no labels this step: window undefined
    w0 = min(e["ts"] for e in evs)
    w1 = max(e["ts"] + e["dur"] for e in evs)
    window = max(w1 - w0, 1)
    rk_out = []
    for rk in ranks:
        mine = by_rank_step[(rk, step)]
        busy = iv.union([e["ts"] for e in mine], [e["ts"] + e["dur"] for e in mine])
        busy_ns = iv.total(busy)
        sw = windows.get((rk, step))
        step_ns = sw[1] - sw[0] if sw else None
        pset = iv.clip(p2p.get((rk, step), iv.empty()), w0, w1)
        rk_out.append({
            "rank": rk,
            "stage_ids": sorted({e["stage"] for e in mine}),
            "busy_ns": busy_ns,
            "bubble": 1.0 - busy_ns / window,
            "bubble_of_step": (1.0 - busy_ns / step_ns) if step_ns else None,
            "p2p_ns": iv.total(pset),
            "p2p_wait_ns": iv.total(iv.subtract(pset, busy)),
        })
    return {"step": step, "window_ns": window, "bubble": float(np.mean([x["bubble"] for x in rk_out])),
            "ranks": rk_out}


def _stage_compute(compute: list[dict[str, Any]], stage_ranks: dict[int, set[int]], man: dict[str, Any]
                   ) -> tuple[list[dict[str, Any]], dict[tuple[int, int, str], list[int]]]:
    """Stage compute: summed phase time per step, averaged over steps and replicas; and the
    durations per (stage, micro-batch, phase)."""
    per_stage_step: dict[tuple[int, int, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    per_mb: dict[tuple[int, int, str], list[int]] = defaultdict(list)
    for r in compute:
        per_stage_step[(r["stage"], r["rank"], r["step"])][r["phase"]] += r["dur"]
        per_mb[(r["stage"], r["microbatch"], r["phase"])].append(r["dur"])
    layers = man["stage_layers"] if isinstance(man["stage_layers"], list) else None
    stage_out = []
    for s in sorted(stage_ranks):
        vals = [d for (st, _, _), d in per_stage_step.items() if st == s]
        fwd = float(np.mean([d.get("fwd", 0) for d in vals]))
        bwd = float(np.mean([sum(d.get(ph, 0) for ph in BWD_PHASES) for d in vals]))
        stage_out.append({"stage": s, "ranks": sorted(stage_ranks[s]), "compute_ns": int(round(fwd + bwd)),
                          "fwd_ns": int(round(fwd)), "bwd_ns": int(round(bwd)),
                          "layers": int(layers[s]) if layers and s < len(layers) else None})
    return stage_out, per_mb


def _from_labels(store: RunStore, config: AnalysisConfig, rows: list[dict[str, Any]]) -> PipelineResult:
    offsets = _clock_offsets(store)
    for r in rows:
        r["ts"] = r["ts"] - offsets.get(r["rank"], 0)
    compute = [r for r in rows if r["phase"] in COMPUTE_PHASES]
    man = _manifest_pipeline(store)
    stage_ranks: dict[int, set[int]] = defaultdict(set)
    for r in compute:
        stage_ranks[r["stage"]].add(r["rank"])
    inferred = infer_pipelines(load_p2p(store))
    pipelines = _labelled_pipelines(store, compute, stage_ranks, inferred)
    p = len(pipelines[0])
    v = max(1, len(stage_ranks) // p) if p else 1
    m = int(man["microbatches"] or len({r["microbatch"] for r in compute}))
    detected = _detect_schedule(compute, v)
    if detected != "zb" and inferred and inferred[0].schedule:
        detected = inferred[0].schedule  # the order of sends and receives; labels only add split backwards
    schedule = man["schedule"] or detected
    windows = _step_windows(store, offsets)
    p2p = _p2p_intervals(store, offsets)
    by_rank_step: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in compute:
        by_rank_step[(r["rank"], r["step"])].append(r)
    pipe_out, step_saving_base = [], []  # (window_ns, bubble, step_ns)
    for ranks in pipelines:
        steps_out = [x for x in (_labelled_step(ranks, step, by_rank_step, windows, p2p)
                                 for step in sorted({r["step"] for r in compute})) if x is not None]
        for x in steps_out:
            step_ns_list = [windows[(rk, x["step"])][1] - windows[(rk, x["step"])][0] for rk in ranks
                            if (rk, x["step"]) in windows]
            step_saving_base.append((x["window_ns"], x["bubble"],
                                     max(step_ns_list) if step_ns_list else x["window_ns"]))
        pipe_out.append({"ranks": ranks, "steps": steps_out})
    bubbles = [b for _, b, _ in step_saving_base]
    stage_out, per_mb = _stage_compute(compute, stage_ranks, man)
    comp = np.array([x["compute_ns"] for x in stage_out], dtype=float)
    imbalance = float(comp.max() / comp.mean()) if comp.size > 1 and comp.mean() > 0 else None
    measured = float(np.mean(bubbles)) if bubbles else None
    section = _empty_section()
    section.update({
        "source": "labels", "schedule": schedule, "schedule_detected": detected, "num_stages": p,
        "chunks_per_rank": v, "num_microbatches": m, "theoretical_bubble": theoretical_bubble(p, m, v) if p > 1 else None,
        "measured_bubble": measured, "imbalance": imbalance, "stages": stage_out, "pipelines": pipe_out,
        "per_microbatch": [{"stage": s, "microbatch": mb, "phase": ph, "mean_ns": int(round(np.mean(d)))}
                           for (s, mb, ph), d in sorted(per_mb.items())],
        "diagram": _diagram(pipelines[0], by_rank_step, pipe_out[0]["steps"], config.max_timeline_intervals),
    })
    findings: list[Finding] = []
    if p > 1 and measured is not None and step_saving_base:
        findings.extend(_bubble_finding(section, step_saving_base, man, pipelines))
    if imbalance is not None:
        findings.extend(_imbalance_finding(section, stage_out, imbalance, p, v, m, schedule,
                                           step_saving_base, man))
    return PipelineResult(findings=findings, section=section)


def _diagram(ranks: list[int], by_rank_step: dict, steps_out: list[dict[str, Any]],
             budget: int) -> dict[str, Any] | None:
    """Intervals of the last complete step of one pipeline, relative to the window start."""
    if not steps_out:
        return None
    step = steps_out[-1]["step"]
    evs = sorted((e for rk in ranks for e in by_rank_step.get((rk, step), [])), key=lambda e: e["ts"])
    t0 = min(e["ts"] for e in evs)
    return {"step": step, "ranks": ranks, "window_ns": steps_out[-1]["window_ns"],
            "intervals": [{"rank": e["rank"], "stage": e["stage"], "microbatch": e["microbatch"],
                           "phase": e["phase"], "start_ns": e["ts"] - t0, "dur_ns": e["dur"]}
                          for e in evs[:budget]]}


def _severity(saving_ns: float, step_ns: float) -> Severity:
    frac = saving_ns / step_ns if step_ns > 0 else 0.0
    if frac >= SAVING_CRITICAL:
        return Severity.CRITICAL
    if frac >= SAVING_WARNING:
        return Severity.WARNING
    return Severity.INFO


def _bubble_finding(section: dict[str, Any], base: list[tuple[int, float, int]], man: dict[str, Any],
                    pipelines: list[list[int]]) -> list[Finding]:
    p, v, m = section["num_stages"], section["chunks_per_rank"], section["num_microbatches"]
    window = float(np.mean([w for w, _, _ in base]))
    step_ns = float(np.mean([s for _, _, s in base]))
    measured = section["measured_bubble"]
    comp = [x["compute_ns"] for x in section["stages"]]
    comp = comp if comp and None not in comp else None
    advice = recommend.advise_bubble(p=p, m=m, v=v, schedule=section["schedule"], measured_bubble=measured,
                                     window_ns=window, stage_compute_ns=comp,
                                     max_microbatches=_max_microbatches(man, m))
    sev = _severity(advice.saving_ns, step_ns)
    theory = section["theoretical_bubble"]
    excess_ns = max(0.0, measured - theory) * window if theory is not None else 0.0
    sev_excess = _severity(excess_ns, step_ns)
    if m >= p and sev.order > sev_excess.order:
        # enough micro-batches to fill the pipeline: the schedule's own bubble is the configuration working
        # as designed, not a fault; only idle beyond it (late sends, stalls, uneven stages) can be one
        schedule_note = (f"the bubble the schedule implies ({theory:.0%} for p={p}, m={m}) is no fault; idle "
                         f"beyond it is {excess_ns / 1e6:.2f} ms per step ({excess_ns / step_ns:.1%} of the step)")
        sev = sev_excess
    else:
        schedule_note = None
    ranks = tuple(sorted({r for g in pipelines for r in g}))
    summary = (f"pipeline bubble {measured:.0%} of the schedule window (theory {section['theoretical_bubble']:.0%}"
               f" for {section['schedule']}, p={p}, m={m}" + (f", v={v}" if v > 1 else "") + ")")
    evidence = {"measured_bubble": measured, "theoretical_bubble": section["theoretical_bubble"],
                "num_stages": p, "num_microbatches": m, "chunks_per_rank": v, "schedule": section["schedule"],
                "window_ns": int(window), "step_ns": int(step_ns), "excess_over_schedule_ns": int(excess_ns),
                "too_few_microbatches": m < p, **advice.evidence}
    if schedule_note is not None:
        evidence["severity_note"] = schedule_note
    if comp and v == 1 and len(comp) == p:
        model = ((m - 1) * max(comp) + sum(comp)) / m
        evidence["model_window_ns"] = int(model)  # equal-share pipeline model with the measured stage times
        evidence["unexplained_idle_ns"] = int(max(0.0, window - model))
    return [Finding(kind=FindingKind.PIPELINE_BUBBLE, severity=sev, summary=summary, ranks=ranks, dim="pp",
                    evidence=BubbleEvidence.of(evidence), recommendation=advice.text, est_saving_ns=int(advice.saving_ns))]


def _max_microbatches(man: dict[str, Any], m: int) -> int | None:
    """Largest micro-batch count the batch allows (one sequence per micro-batch), when the manifest says."""
    gbs, dp = man.get("global_batch_size"), man.get("dp") or 1
    if not gbs:
        return None
    return max(int(gbs) // int(dp), m)


def _imbalance_finding(section, stage_out, imbalance, p, v, m, schedule, base, man) -> list[Finding]:
    comp = [x["compute_ns"] for x in stage_out]
    slowest = stage_out[int(np.argmax(comp))]
    step_ns = float(np.mean([s for _, _, s in base])) if base else float(max(comp))
    layers = [x["layers"] for x in stage_out]
    advice = recommend.advise_imbalance(stage_compute_ns=comp, stage_layers=layers if None not in layers else None,
                                        num_microbatches=m)
    if imbalance >= IMBALANCE_CRITICAL:
        sev = Severity.CRITICAL
    elif imbalance >= IMBALANCE_WARNING:
        sev = Severity.WARNING
    else:
        sev = Severity.INFO
    if advice.saving_ns < IMBALANCE_MIN_SAVING * step_ns:
        sev = Severity.INFO  # nothing worth re-splitting for (e.g. one micro-batch: stages run one after another)
    summary = (f"pipeline stage {slowest['stage']} computes {imbalance:.2f}x the mean stage "
               f"({slowest['compute_ns'] / 1e6:.1f} ms vs {np.mean(comp) / 1e6:.1f} ms per step)")
    evidence = {"imbalance": imbalance, "slowest_stage": slowest["stage"], "stage_compute_ns": comp,
                "stage_layers": layers, "num_microbatches": m, "step_ns": int(step_ns), **advice.evidence}
    return [Finding(kind=FindingKind.PIPELINE_IMBALANCE, severity=sev, summary=summary,
                    ranks=tuple(slowest["ranks"]), dim="pp", evidence=StageImbalanceEvidence.of(evidence), recommendation=advice.text,
                    est_saving_ns=int(advice.saving_ns))]


def _trace_kinds(store: RunStore) -> dict[int, str]:
    t = store.table("ranks", ["rank", "trace_kind"]).to_pylist()
    return {r["rank"]: (r["trace_kind"] or "cpu") for r in t}


def _device_busy(store: RunStore, rank: int, offset: int) -> dict[int, tuple[int, int, iv.IntervalSet]]:
    """GPU trace: per step (by the launching op's step), (first kernel start, last kernel end, busy)
    where busy is the union of the step's non-communication kernels, on rank 0's clock."""
    rows = table_rows(store.rank_table("kernels", rank, ["ts", "dur", "kind", "step"]))
    per: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for k in rows:
        if k["step"] is not None and k["dur"] is not None and k["dur"] >= 0:
            per[k["step"]].append(k)
    out = {}
    for step, ks in per.items():
        comp = [k for k in ks if k["kind"] != "comm"]
        busy = iv.union([k["ts"] - offset for k in comp], [k["ts"] + k["dur"] - offset for k in comp])
        lo = min(k["ts"] for k in ks) - offset
        out[step] = (lo, max(k["ts"] + k["dur"] for k in ks) - offset, busy)
    return out


def _host_busy(store: RunStore, windows: dict[tuple[int, int], tuple[int, int]], p2p: list[P2POp], rank: int,
               offset: int) -> dict[int, tuple[int, int, iv.IntervalSet]]:
    """CPU trace: per step, (step start, step end, busy): the step less the time spent waiting for
    receives — a receive is outstanding from its post to the data's arrival, and the stage waits for
    it unless a compute op runs meanwhile (a receive posted early overlaps the stage's own work)."""
    recvs: dict[int, list[P2POp]] = defaultdict(list)
    for o in p2p:
        if o.op == "recv":
            recvs[o.step].append(o)
    ev = store.rank_table("events", rank, ["ts", "dur", "role", "lane"])
    dur = ev["dur"].fill_null(0).to_numpy()
    ops = (text_test(ev["role"], pc.equal, "compute").fill_null(False).to_numpy(zero_copy_only=False)
           & text_test(ev["lane"], pc.equal, "host").fill_null(False).to_numpy(zero_copy_only=False)
           & (dur > 0))
    ts = ev["ts"].to_numpy()[ops] - offset
    working = iv.union(ts, ts + dur[ops])
    out = {}
    for (rk, step), (w0, w1) in windows.items():
        if rk != rank:
            continue
        rs = recvs.get(step, [])
        pending = iv.clip(iv.union([o.start - offset for o in rs], [o.end - offset for o in rs]), w0, w1)
        out[step] = (w0, w1, iv.subtract((np.array([w0]), np.array([w1])), iv.subtract(pending, working)))
    return out


def _p2p_evidence(store: RunStore, pipes: list[InferredPipeline], man: dict[str, Any]) -> dict[str, Any]:
    """What else says these ranks form a pipeline: pp-named groups, the manifest (evidence only)."""
    chains = [set(x.ranks) for x in pipes]
    named = [g for g in _pp_groups(store) if set(g) in chains]
    ev: dict[str, Any] = {"pp_groups_matching": named, "in_flight": [x.in_flight for x in pipes]}
    for key in ("schedule", "microbatches"):
        if man.get(key) is not None:
            ev[f"manifest_{key}"] = man[key]
    return ev


def _from_p2p(store: RunStore, config: AnalysisConfig) -> PipelineResult:
    """Unlabelled traces: pipelines inferred from the p2p graph (pipeline_graph.py); a stage's busy time
    is its device compute (GPU traces) or its step less its receive waits (CPU traces)."""
    section = _empty_section()
    p2p = load_p2p(store)
    pipes = infer_pipelines(p2p)
    if not pipes:
        return PipelineResult(findings=[], section=section)
    offsets = _clock_offsets(store)
    kinds = _trace_kinds(store)
    windows = _step_windows(store, offsets)
    man = _manifest_pipeline(store)
    busy = {}
    for rk in {r for x in pipes for r in x.ranks}:
        off = offsets.get(rk, 0)
        busy[rk] = (_device_busy(store, rk, off) if kinds.get(rk) == "gpu"
                    else _host_busy(store, windows, p2p.get(rk, []), rk, off))
    groups = [x.ranks for x in pipes]
    p, v = len(groups[0]), pipes[0].chunks
    m = pipes[0].microbatches or man["microbatches"]
    pipe_out, base, stage_busy = _p2p_steps(groups, busy, kinds.get(groups[0][0]) == "gpu")
    bubbles = [st["bubble"] for pl in pipe_out for st in pl["steps"]]
    measured = float(np.mean(bubbles)) if bubbles else None
    comp = [float(np.mean(stage_busy[i])) if stage_busy[i] else 0.0 for i in range(p)]
    imbalance = max(comp) / float(np.mean(comp)) if p > 1 and np.mean(comp) > 0 else None
    section.update({
        "source": "p2p", "schedule": pipes[0].schedule or man["schedule"], "schedule_detected": pipes[0].schedule,
        "num_stages": p, "chunks_per_rank": v, "num_microbatches": int(m) if m else 0,
        "microbatches_source": ("sends of the first stage" if pipes[0].microbatches else
                                ("manifest" if m else None)),
        "theoretical_bubble": theoretical_bubble(p, int(m), v) if m and p > 1 else None,
        "measured_bubble": measured, "imbalance": imbalance, "pipelines": pipe_out,
        "busy_source": "device kernels" if kinds.get(groups[0][0]) == "gpu" else "host, less receive waits",
        "evidence": _p2p_evidence(store, pipes, man),
        "diagram": _busy_diagram(groups[0], busy, pipe_out[0]["steps"], config.max_timeline_intervals),
        "stages": [{"stage": i, "ranks": [g[i] for g in groups], "compute_ns": int(comp[i]),
                    "fwd_ns": None, "bwd_ns": None, "layers": _stage_layers(man, i)} for i in range(p)]})
    findings = []
    if m and p > 1 and measured is not None and base:
        findings = _bubble_finding(section, base, man, groups)
    if imbalance is not None and m:
        stage_out = [dict(x, ranks=x["ranks"]) for x in section["stages"]]
        findings += _imbalance_finding(section, stage_out, imbalance, p, v, int(m), section["schedule"], base, man)
    return PipelineResult(findings=findings, section=section)


def _stage_layers(man: dict[str, Any], stage: int) -> int | None:
    layers = man["stage_layers"] if isinstance(man["stage_layers"], list) else None
    return int(layers[stage]) if layers and stage < len(layers) else None


def _p2p_steps(groups: list[list[int]], busy: dict[int, dict[int, tuple[int, int, iv.IntervalSet]]],
               union_window: bool):
    """Per pipeline and step, stage bubble = 1 − busy/window. The window runs from the first kernel start to
    the last kernel end over the pipeline's ranks on GPU traces (kernels belong to the step that launched
    them); on CPU traces it is the longest of the ranks' own steps (each rank's step ends at its optimizer
    step, so the ranks' step intervals are staggered: a last stage starts waiting for the next step's
    first activation as soon as its backward is done)."""
    pipe_out, base = [], []
    stage_busy: dict[int, list[int]] = defaultdict(list)
    for ranks in groups:
        steps_out = []
        common = set.intersection(*(set(busy[rk]) for rk in ranks))
        for step in sorted(common):
            if union_window:
                window = max(busy[rk][step][1] for rk in ranks) - min(busy[rk][step][0] for rk in ranks)
            else:
                window = max(busy[rk][step][1] - busy[rk][step][0] for rk in ranks)
            window = max(window, 1)
            rk_out = []
            for i, rk in enumerate(ranks):
                w0, w1, bset = busy[rk][step]
                b = iv.total(bset)
                stage_busy[i].append(b)
                rk_out.append({"rank": rk, "stage_ids": [i], "busy_ns": b, "bubble": 1.0 - b / window,
                               "bubble_of_step": 1.0 - b / max(w1 - w0, 1),
                               "p2p_ns": None, "p2p_wait_ns": None})
            bub = float(np.mean([x["bubble"] for x in rk_out]))
            base.append((window, bub, window))
            steps_out.append({"step": step, "window_ns": window, "bubble": bub, "ranks": rk_out})
        pipe_out.append({"ranks": ranks, "steps": steps_out})
    return pipe_out, base, stage_busy


def _busy_diagram(ranks: list[int], busy: dict[int, dict[int, tuple[int, int, iv.IntervalSet]]],
                  steps_out: list[dict[str, Any]], budget: int) -> dict[str, Any] | None:
    """The last complete step of one inferred pipeline: each stage's busy intervals (phase "busy": the p2p
    graph does not say which are forwards), relative to the earliest of them."""
    if not steps_out:
        return None
    step = steps_out[-1]["step"]
    spans = [(i, int(a), int(b)) for i, rk in enumerate(ranks) for a, b in zip(*busy[rk][step][2])]
    if not spans:
        return None
    t0 = min(a for _, a, _ in spans)
    return {"step": step, "ranks": ranks, "window_ns": steps_out[-1]["window_ns"],
            "intervals": [{"rank": ranks[i], "stage": i, "microbatch": None, "phase": "busy", "start_ns": a - t0,
                           "dur_ns": b - a} for i, a, b in sorted(spans, key=lambda x: x[1])[:budget]]}
