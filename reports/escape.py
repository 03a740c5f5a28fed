"""Escaping for every string that may come from a trace: HTML text, inline JSON, Markdown."""

from __future__ import annotations

import html
import json
import re
from typing import Any

_JSON_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_JSON_UNSAFE_RE = re.compile("[<>&\u2028\u2029]")


_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def _encodable(text: str) -> str:
    """Lone surrogates (a non-UTF-8 file name, os.fsdecode) cannot be written as UTF-8: show U+FFFD."""
    return _SURROGATE_RE.sub("\ufffd", text)


def h(value: Any) -> str:
    """HTML-escape any value as text (quotes included, so it is safe inside attributes too)."""
    return html.escape(_encodable("" if value is None else str(value)), quote=True)


def json_for_script(obj: Any) -> str:
    """JSON safe to place inside a <script> element: no `</script>`, `<!--` or `&` can appear raw."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_json_default)
    return _JSON_UNSAFE_RE.sub(lambda m: _JSON_UNSAFE[m.group(0)], text)


def _json_default(obj: Any) -> Any:
    try:
        import numpy as np

        if isinstance(obj, np.integer):
            return int(obj)
        if isinstance(obj, np.floating):
            return float(obj)
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


_MD_META_RE = re.compile(r"([\\`*_{}\[\]()#|~>])")
_MD_LEADING_RE = re.compile(r"^(\s*)([-+=]|\d+[.)])")


def md(value: Any) -> str:
    """Markdown-escape trace-derived text: HTML metacharacters become entities, Markdown ones get a backslash,
    and newlines become spaces (so a name cannot break a table row or start a new block)."""
    text = _encodable("" if value is None else str(value))
    text = text.replace("\r", " ").replace("\n", " ")
    text = html.escape(text, quote=False)
    text = _MD_META_RE.sub(r"\\\1", text)
    # a leading list/heading marker would start a block if the text ever begins a line
    return _MD_LEADING_RE.sub(lambda m: m.group(1) + "\\" + m.group(2) if m.group(2)[0] in "-+=" else
                              m.group(1) + m.group(2)[:-1] + "\\" + m.group(2)[-1], text)

