"""Golden comparison of `analysis.json`: capture one canonical document per input, compare two captures.

    python benchmarks/golden_analysis.py capture OUT_DIR     # every fixture + every shared trace
    python benchmarks/golden_analysis.py --split 3 capture OUT_DIR   # the same, one-file inputs split
    python benchmarks/golden_analysis.py --compare A B       # field-by-field differences, exit 1 if any

Inputs: every folder under fixtures/ and every trace folder (and every trace file in it, each on its
own) under $TRACEKIT_SHARED_TRACES. A lone trace that states no rank is analyzed with `assume_rank=0`
(the CLI's `--rank 0`). The canonical document is analysis.json without the fields that change from
run to run on the same input (tracekit_version, command, run-store paths, timings), dumped with sorted
keys. An input that fails is captured as {"error": ...} so a change in failures shows up too.

Analysis goes through the library entry point `tracekit.analyze_run` when the package has one, else
through the path the CLI took before it existed (parse_run + analyze_store with the rank prefetch), so
a capture of an older checkout compares with a newer one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
TRACE_SUFFIXES = (".json", ".json.gz")
VOLATILE_TOP = ("tracekit_version", "command")
VOLATILE_KEYS = {"wall_s", "elapsed_s", "elapsed_ns", "timings", "store_path", "trace_dir"}


def iter_inputs() -> Iterator[tuple[str, Path]]:
    """(label, path) for each input: fixture folders, shared-trace folders and their trace files."""
    for d in sorted((ROOT / "fixtures").iterdir()):
        if d.is_dir():
            yield f"fixtures/{d.name}", d
    shared = os.environ.get("TRACEKIT_SHARED_TRACES")
    if not shared or not Path(shared).is_dir():
        return
    for d in sorted(Path(shared).iterdir()):
        if not d.is_dir():
            continue
        files = sorted(f for f in d.iterdir() if f.name.endswith(TRACE_SUFFIXES))
        yield f"shared/{d.name}", d
        if len(files) > 1:
            for f in files:
                yield f"shared/{d.name}/{f.name}", f


def _analyze_legacy(path: Path, out: Path, assume_rank: int | None) -> dict[str, Any]:
    from tracekit.flow import analyze_store
    from tracekit.config import AnalysisConfig
    from tracekit.engines.local import LocalEngine
    from tracekit.engines.rank_tasks import prefetch_rank_activity
    from tracekit.parse.run import parse_run

    engine = LocalEngine(workers=1)
    store = parse_run(path, out / "tables", workers=1, progress=False, engine=engine,
                      assume_rank=assume_rank).store
    if not store.ranks():
        from tracekit.errors import NothingToAnalyzeError

        raise NothingToAnalyzeError(f"{path}: no trace could be analysed")
    return analyze_store(store, AnalysisConfig(), prefetch=prefetch_rank_activity(engine))


def analyze_one(path: Path, out: Path, assume_rank: int | None, workers: int = 1) -> dict[str, Any]:
    import tracekit

    entry = getattr(tracekit, "analyze_run", None)
    if entry is None:
        return _analyze_legacy(path, out, assume_rank)
    return entry(path, out=out, assume_rank=assume_rank, workers=workers, write_reports=False).analysis


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def canonical(analysis: dict[str, Any], tmp: Path) -> dict[str, Any]:
    doc = {k: v for k, v in analysis.items() if k not in VOLATILE_TOP}
    # temporary paths (the run store, skipped files' folders) differ from run to run
    text = json.dumps(_strip(doc), sort_keys=True, default=str).replace(str(tmp), "<tmp>")
    import tracekit  # the checkout analyzed (PYTHONPATH) may be another than this script's

    for root in {str(Path(tracekit.__file__).resolve().parents[1]), str(ROOT)}:
        text = text.replace(root, "<root>")
    return json.loads(text)


def force_split() -> None:
    """Let a file of 128 KB or more be decoded by several processes (tracekit/parse/split.py; set in this
    process, so for inputs of one file), so a capture with several workers shows the split changes nothing."""
    from tracekit.parse import split

    split.MIN_PART_BYTES = 64 << 10


def capture(out_dir: Path, workers: int = 1) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    for label, path in iter_inputs():
        with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
            tmp_path = Path(tmp)
            try:
                try:
                    doc = canonical(analyze_one(path, tmp_path / "a", None, workers), tmp_path)
                except Exception as first:  # a lone trace without a rank: as `--rank 0`
                    doc = canonical(analyze_one(path, tmp_path / "b", 0, workers), tmp_path)
                    doc["assumed_rank"] = 0
                    doc["without_rank"] = f"{type(first).__name__}"
            except Exception as exc:  # captured: a change in what fails is a difference too
                # nothing to analyze: the kind only (the wording lists skipped files and varies)
                doc = {"error": type(exc).__name__ if type(exc).__name__ == "NothingToAnalyzeError"
                       else f"{type(exc).__name__}: {exc}".replace(str(tmp_path), "<tmp>")}
        name = label.replace("/", "__") + ".json"
        (out_dir / name).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        status = doc.get("error") or f"{len(doc.get('findings', []))} findings"
        print(f"{label}: {status}", flush=True)
    return 0


def diff_values(a: Any, b: Any, where: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a:
                yield f"{where}.{k}: added {_short(b[k])}"
            elif k not in b:
                yield f"{where}.{k}: removed {_short(a[k])}"
            else:
                yield from diff_values(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{where}: length {len(a)} -> {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            yield from diff_values(x, y, f"{where}[{i}]")
    elif a != b:
        yield f"{where}: {_short(a)} -> {_short(b)}"


def _short(v: Any, width: int = 120) -> str:
    s = json.dumps(v, sort_keys=True, default=str)
    return s if len(s) <= width else s[: width - 3] + "..."


def compare(a_dir: Path, b_dir: Path, limit: int = 40) -> int:
    names = sorted({p.name for p in a_dir.glob("*.json")} | {p.name for p in b_dir.glob("*.json")})
    differing = 0
    for name in names:
        pa_, pb_ = a_dir / name, b_dir / name
        if not pa_.exists() or not pb_.exists():
            print(f"{name}: only in {'B' if not pa_.exists() else 'A'}")
            differing += 1
            continue
        diffs = list(diff_values(json.loads(pa_.read_text()), json.loads(pb_.read_text())))
        if not diffs:
            print(f"{name}: identical")
            continue
        differing += 1
        print(f"{name}: {len(diffs)} difference(s)")
        for d in diffs[:limit]:
            print(f"    {d}")
        if len(diffs) > limit:
            print(f"    ... {len(diffs) - limit} more")
    print(f"{len(names) - differing} of {len(names)} inputs identical")
    return 1 if differing else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), type=Path, help="compare two captures")
    ap.add_argument("--limit", type=int, default=40, help="differences printed per input")
    ap.add_argument("--split", type=int, default=0, metavar="N",
                    help="capture with N workers, files of 128 KB or more decoded by N processes")
    ap.add_argument("command", nargs="?", choices=["capture"])
    ap.add_argument("out", nargs="?", type=Path)
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare, limit=args.limit)
    if args.command == "capture" and args.out:
        if args.split:
            force_split()
        return capture(args.out, args.split or 1)
    ap.error("give `capture OUT_DIR` or `--compare A B`")
    return 2


if __name__ == "__main__":
    sys.exit(main())
