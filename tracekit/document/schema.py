"""analysis.json's JSON schema, generated from the typed document (tracekit/schemas/analysis.schema.json).

    python -m tracekit.document.schema          # rewrite tracekit/schemas/analysis.schema.json
    python -m tracekit.document.schema --check  # exit 1 when the committed file is not the generated one

msgspec writes the schema of the structs (without the defaults readers fill in); on top of it: a field is `required` when analysis.json always
holds it (every field without the UNSET default; `Sections` lists the sections that ran, none required),
`schema` is the constant, and the enums / bounds the schema has always stated for the finding's severity
and the per-rank numbers are kept.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from tracekit.document import model
from tracekit.document.model import ANALYSIS_SCHEMA, AnalysisDocument, Sections

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "analysis.schema.json"
_DEFS = "#/$defs/{name}"

_EXTRA: dict[tuple[str, str], dict[str, Any]] = {
    ("AnalysisDocument", "schema"): {"const": ANALYSIS_SCHEMA},
    ("FindingDoc", "severity"): {"enum": ["info", "warning", "critical"]},
    ("FindingDoc", "est_saving_ns"): {"type": "integer", "minimum": 0},
    ("RankBreakdown", "bound"): {"enum": ["compute", "communication", "sync_wait", "idle"]},
    ("RankBreakdown", "overlap_ratio"): {"type": ["number", "null"], "minimum": 0, "maximum": 1},
    **{("RankBreakdown", k): {"type": "integer", "minimum": 0}
       for k in ("rank", "steps", "step_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "other_ns", "idle_ns",
                 "sync_wait_ns", "exposed_transfer_ns", "carry_over_ns")},
}
"""Constraints the hand-written schema stated, kept (the structs type these fields more loosely so that a
reader decodes any document)."""


def _structs() -> list[type[msgspec.Struct]]:
    return [c for c in vars(model).values()
            if isinstance(c, type) and issubclass(c, msgspec.Struct) and c is not model.Struct]


def analysis_schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of analysis.json."""
    (root,), defs = msgspec.json.schema_components([AnalysisDocument], ref_template=_DEFS)
    for cls in _structs():
        comp = defs.get(cls.__name__)
        if comp is None:
            continue
        required = [] if cls is Sections else [f.encode_name for f in msgspec.structs.fields(cls)
                                               if f.default is not msgspec.UNSET]
        for prop in comp.get("properties", {}).values():
            prop.pop("default", None)  # readers' defaults for partial documents, not what analysis.json holds
        if required:
            comp["required"] = required
        else:
            comp.pop("required", None)
        for (name, field), extra in _EXTRA.items():
            if name == cls.__name__:
                prop = comp["properties"][field]
                prop.pop("anyOf", None)
                prop.pop("type", None)
                prop.update(extra)
    top = defs.pop("AnalysisDocument")
    assert root == {"$ref": _DEFS.format(name="AnalysisDocument")}
    top.pop("title", None)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": ANALYSIS_SCHEMA,
            "title": "tracekit analysis.json", **top, "$defs": dict(sorted(defs.items()))}


def schema_text() -> str:
    return json.dumps(analysis_schema(), indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = schema_text()
    if "--check" in argv:
        same = SCHEMA_PATH.is_file() and SCHEMA_PATH.read_text(encoding="utf-8") == text
        if not same:
            print(f"{SCHEMA_PATH} is not the schema generated from tracekit/document/model.py: "
                  "run python -m tracekit.document.schema", file=sys.stderr)
        return 0 if same else 1
    SCHEMA_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
