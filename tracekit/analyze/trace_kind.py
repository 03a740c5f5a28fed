"""What kind of trace each rank is, said in words (DESIGN §10 "Trace kinds"): which accelerator its device
rows come from; CUDA/HIP-graph capture or replay; training or inference; kernels carried over from
before profiling; how its steps were found. The spellings (graph API names, autograd / optimizer names,
Kineto's accelerator categories) live in parse/classify.py.

Consequences, applied by the recommendations pass (reconcile.py):
- capture-only ranks (kernels captured into a graph, almost none run): their timing is the capture's,
  not the workload's, so there is no verdict (`verdict: null` with the reason) and no finding on them;
- inference ranks (no backward, no optimizer): no training advice (activation checkpointing, recompute);
- communication-only ranks (collectives in their steps, no compute, no backward or optimizer: a collective
  benchmark or test loop): no overlap advice — there is no compute to hide the collectives behind
  (`unoverlapped_collective` is not given; `communication_bound` is info and says so).

Section `trace_kind`:
    {"ranks": [{"rank", "accelerator": str | null, "device_categories": {cat: rows},
                "graph": {"mode": "capture_only|graph_replay|eager", "captures", "captured_launches",
                          "graph_launches", "kernels_run"},
                "workload": "training|inference|communication|unknown", "backward_ops", "optimizer_steps",
                "carry_over": {"kernels", "ns", "share_of_kernel_time"},
                "step_rule": str | null, "steps": int | null, "notes": [str]}],
     "verdict": "given" | null, "no_verdict_reason": str | null,
     "capture_only_ranks": [int], "inference_ranks": [int], "communication_ranks": [int], "notes": [str]}
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from tracekit.analyze.breakdown import BreakdownResult
from tracekit.findings.result import AnalyzerResult, section_of
from tracekit.parse.classify import Names, graph_mode, workload_of
from tracekit.parse.dict_columns import text_test
from tracekit.tables.store import RunStore

_RULES = {"profiler_step": "ProfilerStep annotations", "optimizer_step": "iterations ending at each optimizer step "
          "(no ProfilerStep)", "graph_launch": "iterations starting at each CUDA/HIP graph launch (no ProfilerStep)",
          "repeated_ops": "iterations where the top-level host op sequence repeats (no ProfilerStep)",
          "device_span": "one window from the first to the last device event (no ProfilerStep, no repeats found)",
          "trace": "one window from the first to the last event (no ProfilerStep)"}


@dataclass(frozen=True)
class TraceKindResult(AnalyzerResult):
    def capture_only(self) -> set[int]:
        return set((self.section or {}).get("capture_only_ranks") or [])

    def inference(self) -> set[int]:
        return set((self.section or {}).get("inference_ranks") or [])

    def communication_only(self) -> set[int]:
        return set((self.section or {}).get("communication_ranks") or [])


def analyze_trace_kind(store: RunStore, breakdown: BreakdownResult | None) -> TraceKindResult:
    bd = section_of(breakdown)
    details = {d["rank"]: d for d in bd.get("rank_details") or []}
    steps = {r["rank"]: r.get("steps") for r in bd.get("ranks") or []}
    carried = {r["rank"]: r.get("carry_over_ns") or 0 for r in bd.get("ranks") or []}
    comm_only = {r["rank"] for r in bd.get("ranks") or [] if not r.get("compute_ns") and r.get("comm_ns")}
    have = set(store.columns("ranks"))
    rows = store.table("ranks", ["rank"] + [c for c in ("accelerator",) if c in have]).to_pylist()
    blank: dict[tuple, dict[str, Any]] = {}
    out = [_rank_or_blank(store, r["rank"], blank, r.get("accelerator"), details.get(r["rank"], {}),
                          steps.get(r["rank"]), carried.get(r["rank"], 0), r["rank"] in comm_only) for r in rows]
    capture = [x["rank"] for x in out if x["graph"]["mode"] == "capture_only"]
    inference = [x["rank"] for x in out if x["workload"] == "inference"]
    communication = [x["rank"] for x in out if x["workload"] == "communication"]
    reason = None
    if out and len(capture) == len(out):
        g = out[0]["graph"]
        reason = (f"CUDA-graph capture trace: {g['captured_launches']} kernel launches were captured into a graph "
                  f"and {g['kernels_run']} device operations ran (rank {out[0]['rank']}); its timing is the "
                  "capture's, not the workload's, so no verdict is given. Profile the graph's replays instead.")
    notes = sorted({n for x in out for n in x["notes"]})
    section = {"ranks": out, "verdict": None if reason else "given", "no_verdict_reason": reason,
               "capture_only_ranks": capture, "inference_ranks": inference, "communication_ranks": communication,
               "notes": notes}
    return TraceKindResult(findings=[], section=section)


def _rank_or_blank(store: RunStore, rank: int, blank: dict[tuple, dict[str, Any]], accelerator: str | None,
                   detail: dict[str, Any], steps: int | None, carry_ns: int, comm_only: bool) -> dict[str, Any]:
    """`_rank`; for a rank without events or kernels (a log-only rank of a partial recording: 9,968 of
    10,000) its row depends on the arguments only, so it is worked out once per distinct arguments (`blank`)
    and copied (0.8 ms a rank)."""
    if store.rank_rows("events", rank) != 0 or store.rank_rows("kernels", rank) != 0:
        return _rank(store, rank, accelerator, detail, steps, carry_ns, comm_only)
    key = (accelerator, detail.get("step_rule"), detail.get("trace_kind"), steps, carry_ns, comm_only)
    if key not in blank:
        blank[key] = _rank(store, rank, accelerator, detail, steps, carry_ns, comm_only)
    row = copy.deepcopy(blank[key])
    row["rank"] = rank
    return row


def _rank(store: RunStore, rank: int, accelerator: str | None, detail: dict[str, Any], steps: int | None,
          carry_ns: int, comm_only: bool = False) -> dict[str, Any]:
    ev = store.rank_table("events", rank, ["name", "cat", "ts", "dur", "lane"])
    ev = ev.filter(pc.invert(pc.fill_null(text_test(ev["lane"], pc.equal, "device"), False)))
    names = Names.of(ev["name"])
    ts = ev["ts"].to_numpy(zero_copy_only=False)
    end = ts + ev["dur"].fill_null(0).to_numpy(zero_copy_only=False)
    kcols = set(store.columns("kernels"))
    k = store.rank_table("kernels", rank, ["ts", "dur"] + (["carry_over"] if "carry_over" in kcols else []))
    graph = graph_mode(names, ts, end, k.num_rows)
    host_ops = int(pc.sum(text_test(ev["cat"], pc.equal, "cpu_op")).as_py() or 0)
    work = workload_of(names, host_ops)
    if comm_only and work["workload"] != "training":  # collectives and nothing else in its steps
        work["workload"] = "communication"
    total_k = int(pc.sum(k["dur"].fill_null(0)).as_py() or 0) if k.num_rows else 0
    n_carry = int(pc.sum(k["carry_over"].fill_null(False).cast("int64")).as_py() or 0) if "carry_over" in k.column_names else 0
    carry = {"kernels": n_carry, "ns": int(carry_ns), "share_of_kernel_time": carry_ns / total_k if total_k else 0.0}
    rule = detail.get("step_rule")
    row = {"rank": rank, "accelerator": accelerator, "graph": graph, **work, "carry_over": carry,
           "step_rule": rule, "steps": steps}
    row["notes"] = _notes(row, detail.get("trace_kind"))
    return row


def _notes(row: dict[str, Any], kind: str | None) -> list[str]:
    notes = []
    acc = row["accelerator"]
    if acc not in (None, "cuda", "rocm"):
        notes.append(f"accelerator {acc}: device events taken from Kineto's {acc} categories")
    elif acc is None and kind == "cpu":
        notes.append("no device events in the trace: analysed from host ops only (if the job ran on GPUs, the "
                     "profiler did not record device activity)")
    g = row["graph"]
    if g["mode"] == "capture_only":
        notes.append(f"CUDA-graph capture: {g['captured_launches']} launches captured, {g['kernels_run']} device "
                     "operations ran: no verdict")
    elif g["mode"] == "graph_replay":
        notes.append(f"CUDA-graph replay: {g['graph_launches']} graph launch(es); their kernels are timed on the device")
    if row["workload"] == "inference":
        notes.append("inference (no backward, no optimizer step): no training advice")
    elif row["workload"] == "communication":
        notes.append("communication only (collectives and no compute in its steps: a collective benchmark, or a "
                     "trace filtered to its collectives): no overlap advice, the trace has no compute to hide them "
                     "behind")
    c = row["carry_over"]
    if c["kernels"]:
        notes.append(f"{c['kernels']} kernel(s) launched before profiling began ran for {c['ns'] / 1e6:.3f} ms "
                     f"({100 * c['share_of_kernel_time']:.1f}% of the trace's kernel time): counted, in no step")
    if row["step_rule"] in _RULES:
        n = row["steps"]
        notes.append(f"steps: {_RULES[row['step_rule']]}" + (f", {n} analysed" if n is not None else ""))
    return notes
