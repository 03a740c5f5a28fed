"""From the engine's dict to the typed document and from the document to analysis.json's bytes.

- `document_of(analysis)`: the engine's dict (or analysis.json's bytes) as an `AnalysisDocument`,
  checked: the document must hold exactly what the dict holds (a key the structs do not know, a value
  of another type, a missing key raise `DocumentMismatch` naming the first differences) — so analysis.json
  encoded from the document is the dict's JSON value.
- `document_bytes(doc)`: analysis.json's text (indented JSON).
- `as_document(analysis)`: for readers (report, diff, check, advisor): a document, a dict or JSON bytes as
  a document, leniently — a partial or older document decodes with the missing keys at their defaults, and
  a section (finding, rank row) whose shape does not match is left out instead of failing the reader.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, TypeVar

import msgspec

from tracekit.document.model import (AnalysisDocument, AnalyzerError, DocumentInputs, FindingDoc,
                                      RankBreakdown, Sections)

_DECODER = msgspec.json.Decoder(AnalysisDocument)
S = TypeVar("S", bound=msgspec.Struct)


class DocumentMismatch(ValueError):
    """The analysis dict does not fit the typed document (a struct lacks a key, or a type differs)."""


def _plain(value: Any) -> Any:
    """A value JSON has no type for: a numpy scalar as its number, anything else as its text."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        return item()
    return str(value)


def _json_bytes(analysis: dict[str, Any]) -> bytes:
    """The dict as compact JSON (what analysis.json held before the document existed); ASCII with
    escapes where a text holds what UTF-8 cannot (a file name's undecodable bytes)."""
    try:
        return msgspec.json.encode(analysis, enc_hook=_plain)
    except UnicodeEncodeError:
        return json.dumps(analysis, default=_plain).encode("ascii")


def _builtins_of(data: bytes) -> Any:
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:  # lone surrogates written as escapes: json reads them back
        return json.loads(data)


def decode_document(data: bytes | str) -> AnalysisDocument:
    """analysis.json's text as a document (strict about types; unknown keys are ignored)."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError:  # not UTF-8 clean (escaped surrogates)
        return msgspec.convert(json.loads(raw), AnalysisDocument)


def to_builtins(doc: AnalysisDocument) -> dict[str, Any]:
    """The document as plain dicts and lists, in analysis.json's key order (unset keys absent)."""
    return msgspec.to_builtins(doc)


def _differences(a: Any, b: Any, where: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in [*a, *(k for k in b if k not in a)]:
            if k not in b:
                yield f"{where}.{k}: not in the typed document"
            elif k not in a:
                yield f"{where}.{k}: added by the typed document"
            else:
                yield from _differences(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _differences(x, y, f"{where}[{i}]")
    elif a != b or type(a) is not type(b):
        yield f"{where}: {a!r:.80} -> {b!r:.80}"


def document_of(analysis: dict[str, Any] | bytes | AnalysisDocument, check: bool = True) -> AnalysisDocument:
    """The engine's analysis dict (or analysis.json's bytes) as the typed document. With `check`, raise
    DocumentMismatch unless the document encodes to the same JSON value (key order aside)."""
    if isinstance(analysis, AnalysisDocument):
        return analysis
    data = analysis if isinstance(analysis, bytes) else _json_bytes(analysis)
    try:
        doc = decode_document(data)
    except msgspec.ValidationError as exc:
        raise DocumentMismatch(f"analysis does not fit the typed document: {exc}") from exc
    if check:
        before = _builtins_of(data)
        after = to_builtins(doc)
        if before != after:  # every number is typed int | float where it may be either: == is exact
            diffs = list(_differences(before, after))
            raise DocumentMismatch("analysis does not fit the typed document: " + "; ".join(diffs[:5])
                                   + (f" (+{len(diffs) - 5} more)" if len(diffs) > 5 else ""))
    return doc


def document_bytes(doc: AnalysisDocument) -> bytes:
    """analysis.json's text: the document as indented JSON (by msgspec; by json, ASCII with escapes,
    where a text holds what UTF-8 cannot)."""
    try:
        return msgspec.json.format(msgspec.json.encode(doc), indent=1)
    except UnicodeEncodeError:
        return json.dumps(to_builtins(doc), indent=1).encode("ascii")


def _lenient(value: Any, type_: Any, default: Any) -> Any:
    try:
        return msgspec.convert(value, type_)
    except (msgspec.ValidationError, TypeError):
        return default


def _lenient_list(value: Any, type_: Any) -> list[Any]:
    if not isinstance(value, list):
        return []
    out = []
    for item in value:
        try:
            out.append(msgspec.convert(item, type_))
        except (msgspec.ValidationError, TypeError):
            continue
    return out


def as_section(type_: type[S], value: S | dict[str, Any] | None) -> S | None:
    """One section (or other struct) for readers: a struct as it is, a dict as analysis.json would hold
    it (None when its shape does not fit)."""
    if value is None or isinstance(value, type_):
        return value
    try:
        return msgspec.json.decode(_json_bytes(value), type=type_)
    except (msgspec.ValidationError, msgspec.DecodeError, TypeError):
        return None


def as_document(analysis: AnalysisDocument | dict[str, Any] | bytes | None) -> AnalysisDocument:
    """Any analysis as a document, for readers: a document as it is; a dict (the engine's, a loaded
    analysis.json, a hand-written one) or JSON bytes decoded as analysis.json would be, keys it lacks at
    their defaults; a section, finding or rank row of an unexpected shape left out (a reader lays out
    what fits and never fails on the rest)."""
    if isinstance(analysis, AnalysisDocument):
        return analysis
    if analysis is None:
        return AnalysisDocument()
    data = analysis if isinstance(analysis, bytes) else _json_bytes(analysis)
    try:
        return decode_document(data)
    except msgspec.ValidationError:
        pass
    raw = _builtins_of(data)
    if not isinstance(raw, dict):
        return AnalysisDocument()
    sections = raw.get("sections") if isinstance(raw.get("sections"), dict) else {}
    fields = Sections.__struct_fields__
    section_types = {f.name: f.type for f in msgspec.structs.fields(Sections)}
    typed = {name: _lenient(sections[name], section_types[name], None) for name in fields if name in sections}
    top = {f.name: f.type for f in msgspec.structs.fields(AnalysisDocument)}
    return AnalysisDocument(
        schema=_lenient(raw.get("schema"), top["schema"], ""),
        tracekit_version=_lenient(raw.get("tracekit_version"), top["tracekit_version"], ""),
        command=_lenient(raw.get("command"), top["command"], None),
        inputs=_lenient(raw.get("inputs"), DocumentInputs, DocumentInputs()),
        ranks=_lenient_list(raw.get("ranks"), RankBreakdown),
        findings=_lenient_list(raw.get("findings"), FindingDoc),
        sections=Sections(**typed),
        analyzer_errors=_lenient_list(raw.get("analyzer_errors"), AnalyzerError))
