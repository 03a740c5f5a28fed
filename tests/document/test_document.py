"""The typed analysis document: analysis.json of the fixtures decodes into `AnalysisDocument` and encodes back to the same JSON value, key order included; the writer
encodes analysis.json from it; the committed schema is the generated one and the documents validate
against it; readers decode partial or odd documents without failing. Every other analysis the suite makes
(the real shared traces included) is checked against the document too: tests run with
TRACEKIT_STRICT_DOCUMENT=1 (tests/conftest.py), so an analysis that does not fit fails its test.

Expected values come from plain `json` on the engine's dict, never from the document code."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from tracekit.analysis import analyze_run
from tracekit.document import AnalysisDocument, DocumentMismatch, as_document, document_bytes, document_of
from tracekit.document.schema import SCHEMA_PATH, schema_text

REPO = Path(__file__).resolve().parents[2]
FIXTURES = sorted(p for p in (REPO / "fixtures").iterdir() if p.is_dir())
ORDER_FREE = {".sections.matching"}
"""Objects whose key order today depends on the code path (matching's empty section lists its keys in
another order than a matched one): the document writes one order, the values are the same."""


def _plain(analysis: dict[str, Any]) -> Any:
    """The dict as analysis.json held it before the document: JSON of the dict (json, not msgspec)."""
    return json.loads(json.dumps(analysis, default=str))


def _key_orders(value: Any, where: str = "") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if isinstance(value, dict):
        if where not in ORDER_FREE:
            out[where] = list(value)
        for k, v in value.items():
            out.update(_key_orders(v, f"{where}.{k}"))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.update(_key_orders(v, f"{where}[{i}]"))
    return out


@pytest.fixture(scope="module")
def analyses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = {}
    for d in FIXTURES:
        run = analyze_run(d, out=tmp_path_factory.mktemp(d.name), write_reports=False)
        assert run.problems == []  # no mismatch with the typed document
        out[d.name] = {"analysis": run.analysis, "document": run.document, "out": run.out}
    return out


def test_fixture_documents_round_trip_with_their_key_order(analyses: dict[str, dict[str, Any]]) -> None:
    for name, a in analyses.items():
        expected = _plain(a["analysis"])
        doc = msgspec.json.decode(json.dumps(expected).encode(), type=AnalysisDocument)
        again = json.loads(msgspec.json.encode(doc))
        assert again == expected, name
        assert _key_orders(again) == _key_orders(expected), name


def test_analysis_json_is_encoded_from_the_document(analyses: dict[str, dict[str, Any]]) -> None:
    for name, a in analyses.items():
        written = (a["out"] / "analysis.json").read_bytes()
        assert written == document_bytes(a["document"]), name
        assert json.loads(written) == _plain(a["analysis"]), name
        assert isinstance(a["document"].sections.breakdown.ranks[0].step_ns, int), name


def test_documents_validate_against_the_generated_schema(analyses: dict[str, dict[str, Any]]) -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for name, a in analyses.items():
        errors = [e.message for e in validator.iter_errors(_plain(a["analysis"]))]
        assert errors == [], name
    bad = _plain(analyses[FIXTURES[0].name]["analysis"])
    del bad["findings"]
    assert not validator.is_valid(bad)  # a key analysis.json always holds is required
    bad = _plain(analyses[FIXTURES[0].name]["analysis"])
    bad["ranks"][0]["bound"] = "busy"
    assert not validator.is_valid(bad)


def test_committed_schema_is_the_generated_one() -> None:
    assert SCHEMA_PATH.read_text(encoding="utf-8") == schema_text(), \
        "run: python -m tracekit.document.schema"


def test_a_key_the_structs_lack_or_another_type_is_a_mismatch(analyses: dict[str, dict[str, Any]]) -> None:
    analysis = _plain(analyses["pp_1f1b"]["analysis"])
    document_of(analysis)
    extra = copy.deepcopy(analysis)
    extra["sections"]["pipeline"]["a_new_key"] = 1
    with pytest.raises(DocumentMismatch, match="a_new_key"):
        document_of(extra)
    typed = copy.deepcopy(analysis)
    typed["sections"]["pipeline"]["num_stages"] = "two"
    with pytest.raises(DocumentMismatch, match="num_stages"):
        document_of(typed)
    missing = copy.deepcopy(analysis)
    del missing["sections"]["pipeline"]["num_stages"]
    with pytest.raises(DocumentMismatch, match="num_stages"):
        document_of(missing)


def test_an_absent_key_stays_absent_and_null_stays_null(analyses: dict[str, dict[str, Any]]) -> None:
    analysis = _plain(analyses["dp_ddp"]["analysis"])
    stragglers = analysis["sections"]["stragglers"]
    for key in ("excluded", "device_timed"):  # written only in some cases
        stragglers.pop(key, None)
    analysis["sections"]["pipeline"]["measured_bubble"] = None
    again = json.loads(document_bytes(document_of(analysis)))
    assert "excluded" not in again["sections"]["stragglers"] and "device_timed" not in again["sections"]["stragglers"]
    assert again["sections"]["pipeline"]["measured_bubble"] is None


def test_readers_decode_partial_and_odd_documents() -> None:
    partial = {"schema": "tracekit.analysis/1", "ranks": [{"rank": 3, "steps": 2, "step_ns": 10}],
               "findings": [{"kind": "straggler", "severity": "warning", "ranks": [3]}, "not a finding"],
               "sections": {"pipeline": {"measured_bubble": 0.25}, "stragglers": {"ranks": "odd"},
                            "a_future_section": {"x": 1}}}
    doc = as_document(partial)
    assert [r.rank for r in doc.ranks] == [3] and doc.ranks[0].compute_ns == 0
    assert doc.ranks[0].sync_wait_ns is msgspec.UNSET  # an analysis from before the split
    assert [f.kind for f in doc.findings] == ["straggler"] and doc.findings[0].est_saving_ns == 0
    assert doc.sections.pipeline.measured_bubble == 0.25 and doc.sections.pipeline.stages == []
    assert doc.sections.stragglers is None  # its shape does not fit: left out, not an error
    assert as_document(None) == AnalysisDocument() and as_document(doc) is doc


def test_an_analysis_that_does_not_fit_is_written_from_the_dict(analyses: dict[str, dict[str, Any]],
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside tests a mismatch never loses the analysis: analysis.json holds the dict, the problem says why."""
    from tracekit.analysis import STRICT_ENV, write_outputs

    analysis = _plain(analyses["tp"]["analysis"])
    analysis["sections"]["layout"]["a_new_key"] = [1, 2]
    monkeypatch.delenv(STRICT_ENV, raising=False)
    _, problems = write_outputs(analysis, None, tmp_path, reports_too=False)
    assert json.loads((tmp_path / "analysis.json").read_text()) == analysis
    assert len(problems) == 1 and "a_new_key" in problems[0]
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(DocumentMismatch):
        write_outputs(analysis, None, tmp_path, reports_too=False)


def test_reports_import_only_the_document_of_tracekit() -> None:
    """reports/ lays the typed document out: of tracekit's modules it imports tracekit.document only."""
    import ast

    found = set()
    for path in (REPO / "reports").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found |= {(path.name, n) for n in names if n == "tracekit" or n.startswith("tracekit.")}
    assert found and all(n == "tracekit.document" or n.startswith("tracekit.document.") for _, n in found), found
