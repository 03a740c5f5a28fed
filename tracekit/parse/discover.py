"""Finds the inputs of a run in a directory tree and says what each file is, by name and by content.

Kinds: kineto (has `traceEvents`), comms_log (`comms.rank{R}.jsonl`), flight_recorder (JSON with
`entries` + `pg_config`, or a pickle), manifest, routing/pipeline side logs. JSON that is
none of these (e.g. an execution trace, which has `nodes`) is reported as skipped with the reason.
Files of other types (Parquet, HTML, other JSON lines, ...), tracekit's own outputs and the
reference runtime's metrics files are ignored without comment. Hidden files and directories (a name
starting with `.`) are never inputs: they are not listed, opened or read into the store (the simulator
and the reference runtime write their answer key as such a file, so no analyzer can see it).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from isal import isal_zlib

from tracekit.parse.gz import GZIP_MAGIC, decompressed_budget
from tracekit.parse.safe_pickle import looks_like_pickle

KINETO = "kineto"
COMMS_LOG = "comms_log"
FLIGHT_RECORDER = "flight_recorder"
MANIFEST = "manifest"
ROUTING = "routing"
PIPELINE = "pipeline"
MEMORY_SNAPSHOT = "memory_snapshot"

_SNIFF_BYTES = 256 << 10
_SCAN_CHUNK = 4 << 20
_RANK_IN_NAME = re.compile(r"(?<![a-z])rank[-_.]?(\d+)", re.IGNORECASE)
_SIDE_LOG = re.compile(r"^(routing|pipeline)\.rank(\d+)\.jsonl$")
_COMMS_LOG = re.compile(r"^comms\.rank(\d+)\.jsonl$")
_MEMORY_SNAPSHOT = re.compile(r"memory_snapshot.*\.(?:pickle|pkl)$", re.IGNORECASE)  # CUDA allocator snapshots
# What the reference runtime writes beside its traces that is not an input (per-step metrics).
_RUNTIME_SIDE_FILES = re.compile(r"^(?:train_log\.json|metrics\.rank\d+\.jsonl)$")


@dataclass(frozen=True)
class InputFile:
    """One input file, its kind and the rank its name states (None when it states none)."""

    path: Path
    kind: str
    name_rank: int | None


@dataclass
class Discovery:
    inputs: list[InputFile] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[InputFile]:
        return [f for f in self.inputs if f.kind == kind]


def rank_from_filename(path: str | Path) -> int | None:
    """Rank written in a file name: rank3, rank-3, rank_3, rank.3 (case-insensitive); else None."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


def _head(path: Path, n: int = _SNIFF_BYTES) -> bytes:
    """First `n` bytes of the file's content (decompressed when gzip)."""
    with open(path, "rb") as fh:
        raw = fh.read(n)
        if raw[:2] != GZIP_MAGIC:
            return raw
        dec = isal_zlib.decompressobj(31)
        out = bytearray()
        chunk = raw
        while chunk and len(out) < n and not dec.eof:
            try:
                out += dec.decompress(chunk, n - len(out))
            except isal_zlib.error:
                break
            chunk = dec.unconsumed_tail or fh.read(1 << 16)
    return bytes(out)


def _contains(path: Path, needle: bytes) -> bool:
    """Stream the whole (decompressed) file looking for `needle`: the slow fallback of sniffing.

    Decompresses at most _SCAN_CHUNK bytes at a time. A gzip file that expands past the default
    decompression budget (a likely bomb) is not scanned to its end: it is reported as containing
    `needle`, so the parser refuses it with the budget's error.
    """
    tail = b""
    scanned = 0
    pending = b""
    with open(path, "rb") as fh:
        dec = isal_zlib.decompressobj(31) if fh.read(2) == GZIP_MAGIC else None
        fh.seek(0)
        budget = decompressed_budget(path.stat().st_size, None)[0]
        while True:
            if dec is None:
                piece = fh.read(_SCAN_CHUNK)
                if not piece:
                    return False
            else:
                if not pending:
                    pending = fh.read(_SCAN_CHUNK)
                    if not pending:
                        return False
                try:
                    piece = dec.decompress(pending, _SCAN_CHUNK)
                except isal_zlib.error:
                    return False
                pending = dec.unconsumed_tail
                scanned += len(piece)
                if scanned > budget:
                    return True
            buf = tail + piece
            if needle in buf:
                return True
            tail = buf[-len(needle):]


def is_merged_kineto(path: Path) -> bool:
    """A Kineto file holding several ranks' events (TraceLens TraceFusion's marker in its first bytes)."""
    from tracekit.parse.merged import looks_merged

    try:
        return looks_merged(_head(path))
    except OSError:
        return False


def classify_json(path: Path) -> tuple[str | None, str | None]:
    """(kind, None) for a recognised JSON document, (None, reason) for one to skip, (None, None) to ignore."""
    head = _head(path).lstrip()
    if not head:
        if path.stat().st_size == 0:
            return None, "empty file"
        with open(path, "rb") as fh:
            gz = fh.read(2) == GZIP_MAGIC
        return None, ("gzip data decompresses to nothing (corrupt, truncated or empty)" if gz
                      else "file holds only whitespace")
    if not head[:1] in (b"{", b"["):
        return None, "not a JSON object"
    if b'"traceEvents"' in head:
        return KINETO, None
    if re.search(rb'"schema"\s*:\s*"tracekit\.', head[:4096]):
        return None, None  # tracekit's own output (store meta, analysis.json)
    if b'"entries"' in head and (b'"pg_config"' in head or b'"pg_status"' in head):
        return FLIGHT_RECORDER, None
    if b'"nodes"' in head and b'"traceEvents"' not in head:
        return None, "execution trace (has 'nodes', no 'traceEvents'): not a Kineto trace"
    if len(head) >= _SNIFF_BYTES and _contains(path, b'"traceEvents"'):
        return KINETO, None
    if b'"entries"' in head and b'"version"' in head:
        return FLIGHT_RECORDER, None
    return None, "JSON without 'traceEvents' (not a Kineto trace) or Flight Recorder 'entries'"


def _is_store_dir(path: Path) -> bool:
    meta = path / "meta.json"
    if not meta.is_file():
        return False
    try:
        return str(json.loads(meta.read_text()).get("schema", "")).startswith("tracekit.store")
    except (ValueError, OSError, AttributeError):
        return False


def classify(path: Path) -> tuple[str | None, str | None]:
    """What a file is: (kind, None), (None, reason to skip) or (None, None) for unrelated files."""
    name = path.name
    lower = name.lower()
    if name == "manifest.json":
        return MANIFEST, None
    if _RUNTIME_SIDE_FILES.match(name):
        return None, None
    if _COMMS_LOG.match(name):
        return COMMS_LOG, None
    if _MEMORY_SNAPSHOT.search(name):
        return MEMORY_SNAPSHOT, None
    side = _SIDE_LOG.match(name)
    if side:
        return side.group(1), None
    if lower.endswith((".json", ".json.gz")):
        return classify_json(path)
    if lower.endswith(".jsonl"):
        head = _head(path, 1 << 16).split(b"\n", 1)[0]
        try:
            obj = json.loads(head)
        except (ValueError, RecursionError):
            return None, None
        if isinstance(obj, dict) and obj.get("type") == "header" and str(obj.get("version", "")).startswith("tracekit.comms"):
            return COMMS_LOG, None
        return None, None  # no trace format is JSON lines: not an input
    if lower.endswith((".pkl", ".pickle")) or "." not in name:
        try:
            with open(path, "rb") as fh:
                head = fh.read(2)
        except OSError:
            return None, None
        if looks_like_pickle(head):
            return FLIGHT_RECORDER, None
        if lower.endswith((".pkl", ".pickle")):
            return None, "pickle extension but not a pickle"
    return None, None


def discover_inputs(trace_dir: str | Path) -> Discovery:
    """Every input under `trace_dir` (recursively, sorted by path), or `trace_dir` itself when it is a
    file, plus the JSON files it skips."""
    root = Path(trace_dir)
    found = Discovery()
    # a single file given by the user is taken as it is (hidden name or not)
    walk = [(str(root.parent), [], [root.name])] if root.is_file() else os.walk(root)
    for dirpath, dirnames, filenames in walk:
        d = Path(dirpath)
        dirnames[:] = sorted(n for n in dirnames if not n.startswith(".") and not _is_store_dir(d / n))
        for fname in sorted(filenames):
            if fname.startswith(".") and not root.is_file():
                continue
            path = d / fname
            if not path.is_file():
                continue
            try:
                kind, reason = classify(path)
            except OSError as exc:
                kind, reason = None, f"cannot read: {exc.strerror or exc}"
            except RecursionError:
                kind, reason = None, "JSON nested too deeply to read"
            if kind is not None:
                found.inputs.append(InputFile(path=path, kind=kind, name_rank=rank_from_filename(path)))
            elif reason is not None:
                found.skipped.append({"file": str(path), "reason": reason})
    found.inputs.sort(key=lambda f: str(f.path))
    return found
