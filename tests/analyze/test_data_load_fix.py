"""The fix of a rank that loads data slower than its peers: its loading at their pace, nothing else
(issue 32; docs/metrics.md §8 "Straggler / rank compute").

A hand-built 2-rank CPU run shaped like tests/user_scripts/ddp_dataloader.py's faulty recording (one gloo
all-reduce a step): per 56 ms step rank 0 spends 2 ms in PyTorch's DataLoader range, then 10 ms in one
`aten::mm`, arrives at the all-reduce and waits; rank 1 spends 42 ms in its DataLoader range, then 13 ms in
the same `aten::mm` (same shapes: 3 ms slower with no more work, as a busy box makes a rank that computes
alone), arrives, and the all-reduce ends 1 ms later. Removing the injected loading (what DataLoader workers
or prefetching do: rank 1's loading at rank 0's 2 ms) leaves rank 1 arriving at 2 + 13 = 15 ms and the step
ending 1 ms later (the transfer and the thread's resume): 40 ms saved a step, exactly the loading beyond its peer's. Setting rank 1's compute to its
peer's as well (the straggler fix before) replayed 43 ms: the 3 ms of box noise in a computation no fix of
the data loader touches, which a clean re-run does not recover.
"""

from __future__ import annotations

import json

from tests.analyze.analyze_builders import two_rank_gloo_run
from tracekit.flow import analyze_store

MS = 1_000_000
STEP = 56 * MS
STEPS = 3
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
LOAD = {0: 2 * MS, 1: 42 * MS}
MM = {0: 10 * MS, 1: 13 * MS}
TRANSFER = MS // 2
RESUME = MS // 2
"""from the all-reduce's end to the next step's first op (the thread waking up: 0.3-0.5 ms in the recordings)"""


def _store(tmp_path):
    def per_step(r, s, base):
        arrival = base + LOAD[r] + MM[r]
        end = base + LOAD[1] + MM[1] + TRANSFER  # the last arrival + the transfer
        return [{"name": LOADER, "cat": "user_annotation", "ts": base, "dur": LOAD[r]},
                {"name": "aten::mm", "cat": "cpu_op", "ts": base + LOAD[r], "dur": MM[r],
                 "input_dims": json.dumps([[256, 10], [10, 4096]]), "input_types": json.dumps(["float", "float"])}
                ], arrival, end
    return two_rank_gloo_run(tmp_path, per_step, STEP, STEPS, 262_164)


def test_data_loader_straggler_saves_its_loading_beyond_its_peers(tmp_path):
    a = analyze_store(_store(tmp_path))
    loud = [f for f in a["findings"] if f["severity"] in ("warning", "critical")]
    top = loud[0]
    assert top["ranks"] == [1] and top["evidence"].get("cause") == "data_load", \
        [(f["kind"], f["ranks"], f["evidence"].get("cause")) for f in loud]
    # the step with rank 1 loading at rank 0's pace: rank 1 arrives at LOAD[0] + MM[1], the all-reduce ends
    # TRANSFER later, the next step begins RESUME after that; its compute stays as it ran
    assert STEP == LOAD[1] + MM[1] + TRANSFER + RESUME
    replayed_step = LOAD[0] + MM[1] + TRANSFER + RESUME
    assert replayed_step == 16 * MS
    assert top["est_saving_ns"] == top["evidence"]["replayed_saving_ns"] == STEP - replayed_step == LOAD[1] - LOAD[0]
    # the straggler and the host-stall finding of the same loading are one fix: one keeps the saving
    for f in a["findings"]:
        if f is not top and f["evidence"].get("cause") == "data_load":
            assert f["est_saving_ns"] == 0 and f["evidence"]["replayed_saving_ns"] == STEP - replayed_step
