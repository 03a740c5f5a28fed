"""Matching computes on numpy and builds its pandas frames only when a consumer reads them: a run
without a cross-rank instance (a single rank) never imports pandas through matching."""

from __future__ import annotations

import subprocess
import sys

from tracekit.derive.matching import match_collectives

from tests.analyze.analyze_builders import build_store

MS = 1_000_000
EPOCH = 1_700_000_000_123_456_789  # epoch-scale ns: exact in int64, not in float64


def _store(tmp_path, ranks):
    coll = [{"rank": r, "source": "kineto", "pg_name": "0", "seq": i, "seq_source": "args", "op": "all_reduce",
             "ts": EPOCH + i * 10 * MS + r, "dur": MS + r, "enqueue_ts": EPOCH + i * 10 * MS, "group_size": len(ranks)}
            for r in ranks for i in range(1, 4)]
    rows = [{"rank": r, "world_size": len(ranks), "hostname": "h", "first_ts": EPOCH, "last_ts": EPOCH + 100 * MS,
             "trace_kind": "cpu"} for r in ranks]
    return build_store(tmp_path, {"ranks": rows, "collectives": coll})


def test_a_single_rank_is_matched_without_importing_pandas(tmp_path):
    store = _store(tmp_path, [0])
    code = ("import sys\nfrom tracekit.tables.store import RunStore\n"
            "from tracekit.derive.matching import match_collectives\n"
            f"m, _, section = match_collectives(RunStore({str(store.path)!r}), {{}})\n"
            "assert m.n_rows == 0 and m.n_instances == 0 and section['instances'] == 0\n"
            "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_frames_are_built_on_first_access_with_exact_times(tmp_path):
    matched, _, section = match_collectives(_store(tmp_path, [0, 1]), {"0": "dp"})
    assert section["instances"] == matched.n_instances == 3 and matched.n_rows == 6
    rows, inst = matched.rows, matched.instances
    assert matched.rows is rows and len(rows) == 6 and len(inst) == 3  # built once
    assert str(rows["end"].dtype) == "Int64" and str(rows["rank"].dtype) == "Int32"
    assert str(rows["step"].dtype) == "float64" and str(inst["group_size"].dtype) == "float64"
    assert rows["end"].tolist()[:3] == [EPOCH + i * 10 * MS + MS for i in range(1, 4)]
    assert inst["key"].tolist() == ["0#1", "0#2", "0#3"] and inst["dim"].tolist() == ["dp"] * 3
