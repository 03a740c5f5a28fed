"""`tracekit.open`: an analysed run in a notebook, its tables as pandas DataFrames.

    import tracekit
    run = tracekit.open("tracekit-out")        # an `analyze` output folder, a run store, or traces
    run.breakdown()                            # one row per rank: where the step time goes
    run.findings()                             # one row per finding, by estimated saving
    run.collectives()                          # one row per collective instance matched across ranks
    run.critical_path(step)                    # the replayed step's critical path
    run.sql("SELECT name, sum(dur) FROM kernels GROUP BY 1 ORDER BY 2 DESC LIMIT 5")

DIR is one of: an `analyze --out` folder (analysis.json + tables/: nothing is recomputed), a run store
(meta.json: analysed now, in memory), or traces (parsed into a temporary store and analysed). Times are
int64 nanoseconds as in the tables; the methods only lay out what the analysis and the tables hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.errors import StoreError, TracekitError

if TYPE_CHECKING:
    import pandas as pd

    from tracekit.derive.matching import MatchedCollectives
    from tracekit.export.perfetto import PerfettoExport
    from tracekit.tables.store import RunStore

KERNEL_SUMMARY_SQL = """
SELECT rank, kind, name, count(*) AS count, sum(dur) AS total_ns, CAST(round(avg(dur)) AS BIGINT) AS mean_ns,
       max(dur) AS max_ns
FROM kernels WHERE dur IS NOT NULL GROUP BY rank, kind, name ORDER BY rank, total_ns DESC, name
"""
FINDING_COLUMNS = ["kind", "severity", "ranks", "dim", "summary", "est_saving_ns", "recommendation", "evidence"]


class Run:
    """An analysed run: `analysis` (the analysis.json document), `store` (its run store)."""

    def __init__(self, analysis: dict[str, Any], store: RunStore, path: Path | None = None) -> None:
        self.analysis = analysis
        self.store = store
        self.path = path
        self._matched: MatchedCollectives | None = None
        self._matched_done = False

    def __repr__(self) -> str:
        ranks = self.analysis.get("inputs", {}).get("ranks", [])
        return f"<tracekit.Run {self.path} ranks={ranks} findings={len(self.analysis.get('findings', []))}>"

    def section(self, name: str) -> dict[str, Any]:
        """The analysis section `name` ({} when the analyzer did not run)."""
        return (self.analysis.get("sections") or {}).get(name) or {}

    def breakdown(self) -> pd.DataFrame:
        """One row per rank: steps, step_ns, compute_ns, comm_ns, exposed_comm_ns, ... (totals over the
        analysed steps, as analysis.json `ranks`), with each part's share of the step."""
        import pandas as pd

        df = pd.DataFrame(self.analysis.get("ranks") or [])
        for col in ("compute_ns", "exposed_comm_ns", "sync_wait_ns", "other_ns", "idle_ns"):
            if col in df and len(df):
                df[col.replace("_ns", "_share")] = df[col] / df["step_ns"].where(df["step_ns"] > 0)
        return df

    def findings(self) -> pd.DataFrame:
        """One row per finding (analysis.json `findings`, sorted by est_saving_ns)."""
        import pandas as pd

        rows = [{c: f.get(c) for c in FINDING_COLUMNS} for f in self.analysis.get("findings") or []]
        return pd.DataFrame(rows, columns=FINDING_COLUMNS)

    def stragglers(self) -> pd.DataFrame:
        """One row per rank: how often it arrived last at collectives and the delay it caused per step."""
        import pandas as pd

        return pd.DataFrame(self.section("stragglers").get("ranks") or [])

    def memory(self) -> pd.DataFrame:
        """One row per rank and device: peak allocated/reserved, when and what held memory at the peak, per
        step bases and peaks (empty when the traces recorded no memory events: `section('memory')['reason']`
        says why; the allocation timeline stays in `section('memory')`)."""
        import pandas as pd

        rows = [{k: v for k, v in r.items() if k != "timeline"} for r in self.section("memory").get("ranks") or []]
        return pd.DataFrame(rows)

    def matched(self) -> MatchedCollectives | None:
        """Matching's instances (derive/matching.py), computed once from the store."""
        if not self._matched_done:
            from tracekit.derive.topology import analyze_layout
            from tracekit.derive.matching import analyze_matching

            self._matched = analyze_matching(self.store, analyze_layout(self.store)).matched
            self._matched_done = True
        return self._matched

    def collectives(self, members: bool = False) -> pd.DataFrame:
        """One row per collective instance matched across ranks (key = pg_name#seq, op, step, n members,
        first/last arrival, skew, transfer, first_rank/last_rank...; times int64 ns on rank 0's clock);
        with `members=True` one row per (instance, rank) instead (arrival, end, wait)."""
        import pandas as pd

        m = self.matched()
        if m is None:
            return pd.DataFrame()
        df = (m.rows if members else m.instances).copy()
        for col in ("step", "group_size", "bytes"):  # whole numbers with gaps: nullable ints, not floats
            if col in df:
                df[col] = df[col].round().astype("Int64")
        return df

    def collective_calls(self) -> pd.DataFrame:
        """The collectives table: one row per call per rank and source, unmatched."""
        return self.table("collectives")

    def critical_path(self, step: int | None = None) -> pd.DataFrame:
        """The critical path of replayed step `step` (default: the slowest): one row per run of one lane
        (rank, lane, category, name, start_ns, end_ns, ops, dim)."""
        import pandas as pd

        steps = self.section("critical_path").get("steps") or []
        if not steps:
            raise TracekitError("no replayed step: " + str(self.section("critical_path").get("skipped")
                                                          or "the critical_path analysis did not run"))
        if step is None:
            chosen = max(steps, key=lambda s: s["measured_ns"])
        else:
            chosen = next((s for s in steps if s["step"] == step), None)
            if chosen is None:
                raise TracekitError(f"step {step} was not replayed; replayed steps: {[s['step'] for s in steps]}")
        df = pd.DataFrame(chosen.get("path") or [])
        df.insert(0, "step", chosen["step"])
        return df

    def whatif(self, **fixes: Any) -> pd.DataFrame:
        """Replay the steps with fixes (keywords of `tracekit.assess.whatif.parse_fixes`, e.g.
        `rank_compute=["1=median"]`, `no_host_stalls=True`): one row per step (measured, replayed,
        predicted ns)."""
        import pandas as pd

        from tracekit.assess.whatif import parse_fixes, run_whatif

        out = run_whatif(self.store, parse_fixes(**fixes))
        return pd.DataFrame(out.get("steps") or [])

    def table(self, name: str) -> pd.DataFrame:
        """Run-store table `name` as a DataFrame; a clear error when this store has no such table."""
        if not self.store.has(name):
            have = sorted(p.stem for p in self.store.path.glob("*.parquet"))
            raise TracekitError(f"{self.store.path}: this run store has no {name!r} table (it has {', '.join(have)})")
        return self.store.table(name).to_pandas()

    def kernels(self) -> pd.DataFrame:
        """The kernels table (GPU kernels, memcpy, memset), when the store has it."""
        return self.table("kernels")

    def kernel_summary(self) -> pd.DataFrame:
        """One row per rank and kernel name (kind, count, total/mean/max ns): the store's kernel_summary
        table when it has rows, else summed here from the kernels table (empty without kernels)."""
        if self.store.has("kernel_summary") and self.store.table("kernel_summary", ["rank"]).num_rows:
            return self.table("kernel_summary")
        if not self.store.has("kernels"):
            import pandas as pd

            return pd.DataFrame()
        return self.sql(KERNEL_SUMMARY_SQL)

    def ops(self) -> pd.DataFrame:
        """The ops table, when the store has it (stores written before it existed do not)."""
        return self.table("ops")

    def sql(self, query: str) -> pd.DataFrame:
        """DuckDB SQL over the store's tables (one view per table, as `tracekit query`)."""
        return self.store.sql(query).to_pandas()

    def export_perfetto(self, path: str | Path) -> PerfettoExport:
        """The run on one aligned timeline for ui.perfetto.dev (tracekit/export/perfetto.py)."""
        from tracekit.export.perfetto import export_perfetto

        return export_perfetto(self.store, self.analysis, path, matched=self.matched())


def open_run(path: str | Path, **analyze: Any) -> Run:
    """The run at PATH (module docstring); `analyze`: keywords of tracekit.analyze_run when it must run."""
    from tracekit.tables.store import RunStore

    path = Path(path)
    doc = path / "analysis.json"
    if doc.is_file() and (path / "tables" / "meta.json").is_file():
        try:
            analysis = json.loads(doc.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise StoreError(f"{doc}: not a readable analysis.json ({exc})") from None
        return Run(analysis, RunStore(path / "tables"), path)
    if doc.is_file():
        raise StoreError(f"{path}: analysis.json without its run store (tables/); analyze the traces again")
    from tracekit.analysis import analyze_run

    analyze.setdefault("write_reports", False)
    run = analyze_run(path, **analyze)
    return Run(run.analysis, run.store, path)
