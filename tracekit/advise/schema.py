"""advice.json's shape (tracekit/schemas/advice.schema.json), checked before it is written.

jsonschema validates the full schema where it is installed (the test extra); without it the required
keys of every level are still checked, so a malformed document never reaches a user."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def advice_schema() -> dict[str, Any]:
    return json.loads(resources.files("tracekit").joinpath("schemas/advice.schema.json").read_text())


def _required(doc: Any, schema: dict[str, Any], defs: dict[str, Any], where: str) -> None:
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    if not isinstance(doc, dict):
        return
    missing = [k for k in schema.get("required", []) if k not in doc]
    if missing:
        raise ValueError(f"advice.json {where or '(top)'} lacks {', '.join(missing)}")
    for k, sub in schema.get("properties", {}).items():
        if k in doc and isinstance(sub, dict):
            _required(doc[k], sub, defs, f"{where}.{k}".lstrip("."))


def validate_advice(doc: dict[str, Any]) -> None:
    schema = advice_schema()
    try:
        import jsonschema
    except ImportError:
        _required(doc, schema, schema["$defs"], "")
        for i, c in enumerate(doc.get("ranked", [])):
            _required(c, {"$ref": "#/$defs/candidate"}, schema["$defs"], f"ranked[{i}]")
        return
    jsonschema.validate(doc, schema)
