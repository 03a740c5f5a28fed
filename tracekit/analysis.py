"""`tracekit.analyze_run`: the one library path from traces to an analysis.

    run = tracekit.analyze_run("traces/", out="tracekit-out")
    run.analysis["findings"]            # the analysis.json document, as the engine's dict
    run.document.findings               # the same, typed (tracekit.document.AnalysisDocument)
    run.store                           # the run store (tables) it was computed from

PATH is a trace folder, one trace file, or a run store (a folder with meta.json, from `tracekit parse`
or a previous `analyze`). Traces are parsed into `store_dir` (default OUT/tables, else a temporary
folder that lives until the process ends), the analyzers run on `engine` (tracekit.engines: local
process pool or Ray; the per-rank activities are its prefetch), and with OUT the outputs are written:
analysis.json always (encoded from the typed document), report.html and summary.md when there is
something to report. `tracekit analyze`, `diff`, `check` and `advise` all go through here.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from tracekit.document import AnalysisDocument, DocumentMismatch, as_document, document_bytes, document_of
from tracekit.errors import NothingToAnalyzeError

if TYPE_CHECKING:
    from tracekit.config import AnalysisConfig
    from tracekit.tables.store import RunStore

_TEMP_DIRS: list[tempfile.TemporaryDirectory] = []
"""Temporary stores live until the process ends (the caller may still read the returned store)."""


@dataclass
class AnalysisRun:
    analysis: dict[str, Any]
    """The analysis.json document."""
    store: RunStore
    out: Path | None = None
    report: Path | None = None
    """OUT/report.html when it was written."""
    problems: list[str] = field(default_factory=list)
    """Outputs that could not be written (a renderer failing never loses the analysis), and the typed
    document's mismatch when the analysis did not fit it."""
    document: AnalysisDocument | None = None
    """The analysis as the typed document (what analysis.json is encoded from)."""

    def __post_init__(self) -> None:
        if self.document is None:
            self.document = as_document(self.analysis)


STRICT_ENV = "TRACEKIT_STRICT_DOCUMENT"
"""Set (to anything but 0/empty): an analysis that does not fit the typed document raises
DocumentMismatch (tests) instead of being written from the dict with a problem noted."""


def typed_document(analysis: dict[str, Any]) -> tuple[AnalysisDocument, str | None]:
    """(the analysis as the typed document, None) or, when it does not fit (a key the structs lack),
    (a lenient document for the readers, the mismatch) — raised instead under TRACEKIT_STRICT_DOCUMENT."""
    try:
        return document_of(analysis), None
    except DocumentMismatch as exc:
        if os.environ.get(STRICT_ENV, "") not in ("", "0"):
            raise
        return as_document(analysis), str(exc)


def _store_for(path: Path, store_dir: Path | None, out: Path | None, engine: Any, **parse: Any) -> RunStore:
    from tracekit.tables.store import RunStore

    if (path / "meta.json").is_file():
        return RunStore(path)
    from tracekit.parse.run import parse_run

    if store_dir is None and out is not None:
        store_dir = out / "tables"
    if store_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="tracekit-")
        _TEMP_DIRS.append(tmp)
        store_dir = Path(tmp.name) / "tables"
    return parse_run(path, store_dir, workers=engine.workers, engine=engine, **parse).store


def _check_analysable(path: Path, store: RunStore) -> None:
    """NothingToAnalyzeError (with `skipped`, and `problem` when the recording says why) unless some
    rank can be analysed."""
    from tracekit.record.manifest import window_problem

    problem = window_problem(store.manifest)
    if problem:
        msg = f"{path}: {problem}"
    elif not store.ranks():
        msg = (f"{path}: no trace could be analysed"
               + "".join(f"; skipped {s['file']}: {s['reason']}" for s in store.skipped[:5]))
    else:
        return
    exc = NothingToAnalyzeError(msg)
    exc.skipped, exc.problem = list(store.skipped), problem
    raise exc


def _json_document(doc: dict[str, Any]) -> bytes:
    """`doc` as indented JSON: by msgspec (json's indented encoder is pure Python, ~10 ms per 300 KB),
    by json where a text holds what UTF-8 cannot (a file name's undecodable bytes, kept as escapes)."""
    try:
        return msgspec.json.format(msgspec.json.encode(doc, enc_hook=str), indent=1)
    except UnicodeEncodeError:
        return json.dumps(doc, indent=1, default=str).encode("ascii")


def write_outputs(analysis: dict[str, Any], store: RunStore, out: Path, reports_too: bool = True,
                  document: AnalysisDocument | None = None) -> tuple[Path | None, list[str]]:
    """OUT/analysis.json (encoded from the typed document; from the dict when it does not fit the
    document, the mismatch then among the problems), and report.html + summary.md (reports/);
    (report path, problems)."""
    out.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    if document is None:
        document, mismatch = typed_document(analysis)
        problems += [mismatch] if mismatch else []
    else:
        mismatch = None
    (out / "analysis.json").write_bytes(_json_document(analysis) if mismatch else document_bytes(document))
    advice = document.sections.advice
    if advice is not None and advice.available:  # the layout advice also as `tracekit advise` writes it
        (out / "advice.json").write_text(json.dumps(advice.advice, indent=1) + "\n")
    if not reports_too:
        return None, problems
    try:
        import reports
    except ImportError as exc:
        return None, [*problems, f"reports not available ({exc}); wrote analysis.json only"]
    path = None
    try:
        reports.write_parts(out / "report.html", reports.render_html_parts(document, store))  # never one 2 MB string
        path = out / "report.html"
    except Exception as exc:  # a renderer bug must not lose the analysis
        problems.append(f"report.html failed: {type(exc).__name__}: {exc}")
    try:
        (out / "summary.md").write_text(reports.render_markdown(document), encoding="utf-8")
    except Exception as exc:
        problems.append(f"summary.md failed: {type(exc).__name__}: {exc}")
    return path, problems


def analyze_run(path: str | Path, out: str | Path | None = None, config: AnalysisConfig | None = None, *,
                store_dir: str | Path | None = None, engine: Any = None, workers: int = 1,
                assume_rank: int | None = None, max_decompressed_bytes: int | None = None,
                rank_from_name: str | None = None,
                max_memory_bytes: int | None = None, progress: bool = False, command: str | None = None,
                write_reports: bool = True, capture: str | Path | None = None) -> AnalysisRun:
    """Parse PATH (unless it is a run store), analyze it, write the outputs to OUT (if given).

    Raises NothingToAnalyzeError (its `skipped` lists the inputs left out) when no rank could be read;
    a run whose ranks have no events still gets its analysis.json (its `ranks` is empty)."""
    from tracekit.flow import analyze_store
    from tracekit.engines.rank_tasks import prefetch_rank_activity, step_submitter
    from tracekit.process_env import memory_first

    path, out = Path(path), (Path(out) if out is not None else None)
    if not (path.is_dir() or path.is_file()):
        raise NothingToAnalyzeError(f"{path}: no such file or directory")
    own = engine is None
    if own:
        from tracekit.engines.local import LocalEngine

        engine = LocalEngine(workers=workers)
    from tracekit.tables.arrow_env import defer_pandas

    defer_pandas()  # pyarrow's probe would import pandas (~0.3 s) for analyzers that never use it
    try:
        store = _store_for(path, Path(store_dir) if store_dir else None, out, engine, progress=progress,
                           max_decompressed_bytes=max_decompressed_bytes, max_memory_bytes=max_memory_bytes,
                           assume_rank=assume_rank, capture=capture, rank_from_name=rank_from_name)
        _check_analysable(path, store)
        with memory_first(getattr(engine, "budget", None) is not None):  # --max-memory: a peak to keep low
            analysis = analyze_store(store, config, command=command, prefetch=prefetch_rank_activity(engine),
                                      submit=step_submitter(engine), measured=getattr(engine, "release", None))
    finally:
        if own:
            engine.close()
    document, mismatch = typed_document(analysis)
    run = AnalysisRun(analysis=analysis, store=store, out=out, document=document)
    if out is not None:
        run.report, run.problems = write_outputs(analysis, store, out, write_reports and bool(
            document.ranks or document.sections.hang is not None), document=document if not mismatch else None)
    elif mismatch:
        run.problems.append(mismatch)
    return run


def analyze_hang_dumps(out_dir: Path) -> tuple[dict[str, Any] | None, Path]:
    """Analyse `<out>/hang` (the Flight Recorder dumps `tracekit record`'s hang watch collected) into
    `<out>/hang-analysis`; (the top hang finding or None, where the analysis went)."""
    from tracekit.record.hang_watch import HANG_DIR

    dest = out_dir / "hang-analysis"
    run = analyze_run(out_dir / HANG_DIR, dest)
    top = next((f for f in run.analysis["findings"] if f["kind"] == "hang"), None)
    return top, dest
