"""Sheets: the tables users read, one CSV file each (`tracekit analyze --csv DIR`).

    breakdown.csv    one row per rank: where the step time goes (analysis.json `ranks`, with shares)
    findings.csv     one row per finding (evidence as JSON text)
    collectives.csv  one row per collective instance matched across ranks (skew, transfer, last rank)
    stragglers.csv   one row per rank: arrivals last, delay caused per step
    memory.csv       one row per rank and device: peaks (only when the traces recorded memory events)
    kernels.csv      one row per rank and kernel name: count and total/mean/max time in ns (GPU runs;
                     the kernel_summary table where the store has one, else summed from the kernels table)
    ops.csv          the ops table, when the run store has one

Values are laid out as the notebook API returns them (tracekit/notebook.py); lists and dicts are written
as JSON text, times as integer nanoseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from tracekit.notebook import Run

def _cell(v: Any) -> Any:
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, sort_keys=True, default=str)
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):  # numpy arrays from Arrow list columns
        return json.dumps(v.tolist(), default=str)
    return v


def _flat(df: pd.DataFrame) -> pd.DataFrame:
    """Object columns holding lists/dicts as JSON text (a spreadsheet cell holds one value)."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object:
            out[c] = out[c].map(_cell)
    return out


def sheet_frames(run: Run) -> dict[str, pd.DataFrame]:
    """{sheet name: DataFrame} for the run (module docstring): sheets without rows are left out, except
    breakdown and findings (an empty findings sheet says there were none)."""
    frames = {"breakdown": run.breakdown(), "findings": run.findings(), "collectives": run.collectives(),
              "stragglers": run.stragglers(), "memory": run.memory()}
    frames["kernels"] = run.kernel_summary()
    if run.store.has("ops"):
        frames["ops"] = run.ops()
    return {k: v for k, v in frames.items() if k in ("breakdown", "findings") or len(v)}


def write_csvs(run: Run, out_dir: str | Path) -> list[Path]:
    """OUT_DIR/<sheet>.csv for each sheet; the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, df in sheet_frames(run).items():
        path = out_dir / f"{name}.csv"
        _flat(df).to_csv(path, index=False)
        written.append(path)
    return written
