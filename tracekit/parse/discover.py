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
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from isal import isal_zlib

from tracekit.parse.gz import GZIP_MAGIC, decompressed_budget
from tracekit.parse.merged import looks_merged
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


_NUMBERED_NAME = re.compile(r"^(.*?)(\d+)((?:\.(?:pkl|pickle|json|gz|bin|txt))*)$", re.IGNORECASE)


def compile_rank_pattern(pattern: str | None) -> re.Pattern[str] | None:
    """The user's --rank-from-name REGEX: the rank is its group named `rank`, else its first group."""
    if pattern is None:
        return None
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"--rank-from-name {pattern!r} is not a regular expression ({exc})") from None
    if rx.groups < 1:
        raise ValueError(f"--rank-from-name {pattern!r} has no group: put the rank in (\\d+) or (?P<rank>\\d+)")
    return rx


def _pattern_rank(rx: re.Pattern[str], name: str) -> int | None:
    m = rx.search(name)
    if not m:
        return None
    value = m.group("rank") if "rank" in rx.groupindex else m.group(1)
    return int(value) if value is not None and value.isdigit() else None


def _prefix_ranks(files: list[InputFile]) -> dict[Path, int]:
    """Ranks of files named `<prefix><rank>` (torch's own dump names: `_dump_3`, `nccl_trace_rank_3`):
    only where every such file of one kind in a directory shares the prefix (and extension) and the
    numbers are distinct, as torch's Flight Recorder loader infers them."""
    groups: dict[tuple[Path, str], list[InputFile]] = defaultdict(list)
    for f in files:
        groups[(f.path.parent, f.kind)].append(f)
    out: dict[Path, int] = {}
    for members in groups.values():
        matches = [_NUMBERED_NAME.match(f.path.name) for f in members]
        if not all(matches):
            continue
        shapes = {(m.group(1), m.group(3).lower()) for m in matches}
        numbers = [int(m.group(2)) for m in matches]
        if len(shapes) == 1 and len(set(numbers)) == len(numbers):
            out.update({f.path: n for f, n in zip(members, numbers)})
    return out


def settle_name_ranks(inputs: list[InputFile], rank_pattern: re.Pattern[str] | None = None) -> list[InputFile]:
    """Ranks for inputs whose name has no `rank<N>`: the user's --rank-from-name pattern, else, for Flight
    Recorder dumps only (torch names them so; a trace's trailing number is often a pid or a date), the
    `<prefix><rank>` rule (`_prefix_ranks`). Manifests are never ranked."""
    unranked = [f for f in inputs if f.name_rank is None and f.kind != MANIFEST]
    if rank_pattern is not None:
        named = {f.path: _pattern_rank(rank_pattern, f.path.name) for f in unranked}
        inputs = [replace(f, name_rank=named[f.path]) if named.get(f.path) is not None else f for f in inputs]
        unranked = [f for f in inputs if f.name_rank is None and f.kind != MANIFEST]
    by_prefix = _prefix_ranks([f for f in unranked if f.kind == FLIGHT_RECORDER])
    return [replace(f, name_rank=by_prefix[f.path]) if f.path in by_prefix else f for f in inputs]


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
        if head[:1] == b"{":  # a JSON dump named as torch names them (`nccl_trace_rank_3`, no extension)
            kind, reason = classify_json(path)
            return (kind, reason) if kind == FLIGHT_RECORDER else (None, None)
    return None, None


def discover_inputs(trace_dir: str | Path, rank_pattern: re.Pattern[str] | None = None) -> Discovery:
    """Every input under `trace_dir` (recursively, sorted by path), or `trace_dir` itself when it is a
    file, plus the JSON files it skips. Ranks from file names: `rank<N>`, else `rank_pattern`, else
    `<prefix><rank>` (settle_name_ranks)."""
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
    found.inputs = settle_name_ranks(sorted(found.inputs, key=lambda f: str(f.path)), rank_pattern)
    return found
