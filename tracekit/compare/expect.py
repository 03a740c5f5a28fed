"""Expectations for `tracekit check --expect FILE`: what a run should reach, read from an advice.json
(`tracekit advise`: the predicted step, breakdown and memory of a candidate layout) or from a previous
run's analysis.json (its measured numbers), and the checks of a run against them.

Quantities (per step, slowest or worst rank, as `tracekit check` measures them):
 - `step_ns`: step time of the slowest rank (mean over its steps), divided by the recorder's measured
   overhead when the run has one (section `recording.recorder_overhead`: `advise` predicts the steps the job
   runs unprofiled, and a previous run is read the same way),
 - `exposed_comm_ns`: exposed communication per step, worst rank,
 - `bubble`: measured pipeline bubble (fraction of the step; advice: its predicted breakdown's bubble / step),
 - `peak_memory_bytes`: peak allocated memory, fullest rank.
A quantity misses when the run's value exceeds the expected one by more than the tolerance:
value > expected × (1 + tol). For the parts of a step (exposed comm, bubble) the excess must also exceed
tol × the expected step (a part of 0.1 ms growing to 0.3 ms of a 100 ms step is no miss at 10%), so a
run's small parts are judged on the step's scale. A quantity either side lacks is reported, never failed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracekit.compare.check import CheckResult
from tracekit.document import AnalysisDocument, as_document
from tracekit.errors import NothingToAnalyzeError

QUANTITIES = ("step_ns", "exposed_comm_ns", "bubble", "peak_memory_bytes")
PARTS = ("exposed_comm_ns", "bubble")
"""Quantities that are parts of the step (their excess is also judged against tol × expected step)."""


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def measured(analysis: AnalysisDocument | dict[str, Any]) -> dict[str, float | None]:
    """The run's values of QUANTITIES from its analysis (None where it has none); a recorded run's step
    divided by the recorder's measured slowdown (`recording.recorder_overhead.ratio`)."""
    doc = as_document(analysis)
    ranks = [r for r in doc.ranks if r.steps > 0]
    step = [r.step_ns / r.steps for r in ranks]
    exposed = [r.exposed_comm_ns / r.steps for r in ranks]
    pipe, mem, rec = doc.sections.pipeline, doc.sections.memory, doc.sections.recording
    peaks = [r.peak_allocated for r in mem.ranks] if mem is not None else []
    bubble = pipe.measured_bubble if pipe is not None else None
    slowed = (rec.recorder_overhead or {}).get("ratio") if rec is not None and rec.recorder_overhead else None
    if _num(slowed) and slowed > 0 and step:
        step = [v / slowed for v in step]
    return {"step_ns": max(step) if step else None, "exposed_comm_ns": max(exposed) if exposed else None,
            "bubble": float(bubble) if _num(bubble) else None,
            "peak_memory_bytes": float(max(peaks)) if peaks else None}


MESH_DIMS = ("dp", "tp", "pp", "cp", "ep")


def run_mesh(analysis: AnalysisDocument | dict[str, Any] | None) -> dict[str, int] | None:
    """The run's parallel degrees from its layout section (fsdp counts as dp), None when unknown."""
    sec = as_document(analysis).sections.layout
    mesh = sec.mesh_shape if sec is not None else None
    if not mesh:
        return None
    out = {d: int(mesh.get(d) or 1) for d in MESH_DIMS}
    if _num(mesh.get("fsdp")):
        out["dp"] *= int(mesh["fsdp"])
    return out


def _mesh_of(cand: dict[str, Any]) -> dict[str, int]:
    lay = cand.get("layout") if isinstance(cand.get("layout"), dict) else {}
    return {d: int(lay.get(d) or 1) for d in MESH_DIMS}


def _pick(doc: dict[str, Any], candidate: int | None, mesh: dict[str, int] | None) -> tuple[dict[str, Any] | None, str]:
    """The advice's candidate to expect: the N-th ranked one when given; else the first (ranked, then the
    current layout's prediction) with the run's parallel degrees — a run is held to what was predicted for
    its own layout —, else the top-ranked."""
    ranked = [c for c in doc.get("ranked") or [] if isinstance(c, dict)]
    if candidate is not None:
        if not 0 <= candidate < len(ranked):
            raise ValueError(f"advice has {len(ranked)} ranked layouts; --expect-candidate {candidate} is none of them")
        return ranked[candidate], f"advice's ranked layout #{candidate}"
    current = doc.get("current") if isinstance(doc.get("current"), dict) else None
    if mesh is not None:
        for i, c in enumerate(ranked):
            if _mesh_of(c) == mesh:
                return c, f"advice's ranked layout #{i}, the run's layout"
        if current is not None and _mesh_of(current) == mesh:
            return current, "advice's prediction for the run's (current) layout"
    where = "advice's top-ranked layout"
    if mesh is not None:
        where += " (the run's layout " + " ".join(f"{d}{mesh[d]}" for d in MESH_DIMS) + " is none of the advice's)"
    return (ranked[0] if ranked else None), where


def _from_advice(doc: dict[str, Any], candidate: int | None, mesh: dict[str, int] | None = None
                 ) -> tuple[dict[str, float | None], str]:
    cand, where = _pick(doc, candidate, mesh)
    if cand is None:
        raise ValueError("advice.json ranks no layout: nothing to expect")
    bd = cand.get("breakdown_ns") if isinstance(cand.get("breakdown_ns"), dict) else {}
    step = cand.get("predicted_step_ns")
    bubble = bd.get("bubble")
    changes = ", ".join(map(str, cand.get("changes") or [])) or "no change"
    return {"step_ns": float(step) if _num(step) else None,
            "exposed_comm_ns": float(bd["exposed_comm"]) if _num(bd.get("exposed_comm")) else None,
            "bubble": float(bubble) / step if _num(bubble) and _num(step) and step > 0 else None,
            "peak_memory_bytes": float(cand["peak_memory_bytes"]) if _num(cand.get("peak_memory_bytes")) else None,
            }, f"{where} ({changes})"


def load_expectations(path: str | Path, candidate: int | None = None, run: dict[str, Any] | None = None
                      ) -> tuple[dict[str, float | None], str]:
    """Expected QUANTITIES from an advice.json or an analysis.json (a file, or an analyze output dir
    holding analysis.json), and where they come from. `run`: the checked run's analysis (an advice's
    candidate of its layout is expected, see `_pick`). Raises NothingToAnalyzeError for anything else."""
    path = Path(path)
    if path.is_dir() and (path / "analysis.json").is_file():
        path = path / "analysis.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise NothingToAnalyzeError(f"{path}: not a readable expectations file ({exc})") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema == "tracekit.advice/1":
        values, where = _from_advice(doc, candidate, run_mesh(run))
        return values, f"{path}: {where}"
    if schema == "tracekit.analysis/1":
        return measured(doc), f"{path}: previous run"
    raise NothingToAnalyzeError(f"{path}: expected an advice.json (tracekit.advice/1) or an analysis.json "
                                f"(tracekit.analysis/1), got schema {schema!r}")


def _fmt(name: str, v: float) -> str:
    if name == "bubble":
        return f"{v * 100:.1f}%"
    if name == "peak_memory_bytes":
        return f"{v / 2**20:.1f} MiB"
    return f"{v / 1e6:.2f} ms"


def check_expectations(analysis: dict[str, Any], expected: dict[str, float | None], tolerance: float,
                       source: str = "") -> list[CheckResult]:
    """One CheckResult per quantity (name `expect_<quantity>`, limit: the largest value that passes)."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be non-negative, got {tolerance!r}")
    got = measured(analysis)
    step = expected.get("step_ns")  # the parts' scale
    out = []
    for q in QUANTITIES:
        exp, val = expected.get(q), got.get(q)
        if exp is None or val is None:
            why = "not expected" if exp is None else "the run has no such number"
            out.append(CheckResult(f"expect_{q}", exp, None, False, f"{why} ({source})" if source else why))
            continue
        limit = exp * (1 + tolerance)
        if q == "exposed_comm_ns" and step:
            limit = max(limit, exp + tolerance * step)
        elif q == "bubble":  # a fraction of the step: tol × step / step
            limit = max(limit, exp + tolerance)
        detail = f"expected {_fmt(q, exp)} (+{tolerance * 100:g}% → at most {_fmt(q, limit)}), measured {_fmt(q, val)}"
        out.append(CheckResult(f"expect_{q}", limit, val, val > limit, detail + (f"; {source}" if source else "")))
    return out
