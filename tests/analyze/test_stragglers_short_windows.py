"""Straggler causes on a hand-built 2-rank CPU run shaped like a recorded DDP job over 2 profiled steps
(one bucket all-reduce a step, gloo), with known answers (issue 32):

- gloo ends the all-reduce on its own thread after the rank has arrived at the next step's: rank 0's
  previous collective "ends" 0.3 ms after its next arrival. Rank 1 spends 5 ms a step in PyTorch's
  DataLoader (`enumerate(DataLoader)#...`), rank 0 0.2 ms: the cause is the data loader, examined at both
  instances (the first from the step's start; the second with rank 0's window empty), where it read
  "unknown" with no instance examined.
- rank 1 multiplies 2x the rows (its `aten::mm` shapes) and is last at the first all-reduce only (its peer
  was delayed at the second, as a busy process beside does): a straggler whose cause is counted work
  (`uneven_work`, FLOPs from the GEMMs' recorded shapes, the profiler having written none), where no
  straggler was reported (last at 1 of 2).
"""

from __future__ import annotations

import json

from tests.analyze.analyze_builders import two_rank_gloo_run
from tracekit.flow import analyze_store

MS = 1_000_000
STEP = 10 * MS
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _store(tmp_path, per_step):
    """per_step(rank, step, base) -> (events, arrival, end) of that rank's step (2 steps)."""
    return two_rank_gloo_run(tmp_path, per_step, STEP, 2, 660)


def _mm(ts, dur, rows, hidden=2048):
    return {"name": "aten::mm", "cat": "cpu_op", "ts": ts, "dur": dur,
            "input_dims": json.dumps([[rows, 10], [10, hidden]]), "input_types": json.dumps(["float", "float"])}


def test_data_loader_stall_with_async_collective_ends_is_named(tmp_path):
    load = {0: 200_000, 1: 5 * MS}

    def per_step(r, s, base):
        arrival = base + load[r] + MS
        # rank 0's all-reduce ends after its next step's arrival (gloo's thread), rank 1's 1 ms after it arrives
        end = base + STEP + load[0] + MS + 300_000 if r == 0 else base + 7 * MS
        return [{"name": LOADER, "cat": "user_annotation", "ts": base, "dur": load[r]},
                _mm(base + load[r], MS, 256)], arrival, end

    a = analyze_store(_store(tmp_path, per_step))
    (f,) = [f for f in a["findings"] if f["kind"] == "straggler"]
    ev = f["evidence"]
    assert f["ranks"] == [1] and ev["cause"] == "data_load" and "data loader" in f["summary"]
    assert f["severity"] in ("warning", "critical")
    # both instances examined. Delay: 6 − 1.2 = 4.8 ms at the first, 6 − 1.5 = 4.5 ms at the second (from the
    # group's previous collective's end, rank 0's late one). Loader excess: 4.8 ms at the first (windows from
    # the step starts), 5 ms at the second (rank 0's window empty)
    assert ev["instances_examined"] == 2 and ev["delay_ns"] == 4_800_000 + 4_500_000
    assert ev["data_load_excess_ns"] == (load[1] - load[0]) + load[1]


def test_twice_the_rows_on_one_rank_last_at_one_of_two_is_counted_work(tmp_path):
    def per_step(r, s, base):
        rows, dur = (512, 8 * MS) if r == 1 else (256, 4 * MS)
        # second step: rank 0 is held up (descheduled) and arrives 0.5 ms after rank 1
        arrival = base + dur + (int(4.5 * MS) if (r, s) == (0, 1) else 0)
        return [_mm(base, dur, rows)], arrival, base + 9 * MS

    a = analyze_store(_store(tmp_path, per_step))
    (f,) = [f for f in a["findings"] if f["kind"] == "straggler"]
    ev = f["evidence"]
    assert f["ranks"] == [1] and ev["cause"] == "uneven_work" and f["severity"] == "warning"
    assert ev["work_measure"] == "gemm_shape_flops" and ev["work_ratio"] == 2.0 and ev["op_count_ratio"] == 1.0
    assert ev["last_count"] == 1 and ev["instances"] == 2
    assert ev.get("closed_form_saving_ns", f["est_saving_ns"]) == 2 * MS  # 4 ms held back over 2 steps
    # no straggler on counted work alike: the same timings with equal shapes leave rank 1 unreported
    b = analyze_store(_store(tmp_path / "b", lambda r, s, base: (
        [_mm(base, 8 * MS if r == 1 else 4 * MS, 256)],
        base + (8 * MS if r == 1 else 4 * MS) + (int(4.5 * MS) if (r, s) == (0, 1) else 0), base + 9 * MS)))
    assert not [f for f in b["findings"] if f["kind"] == "straggler"]
