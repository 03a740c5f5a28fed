"""Cross-check with PyTorch's own Flight Recorder analyzer (torch.distributed.flight_recorder, the engine of
`python -m torch.distributed.flight_recorder.fr_trace`) on the real dumps.

The dumps are loaded through tracekit's restricted unpickler (never `pickle.load`, which fr_trace's loader
uses) and handed to torch's `build_db`. For each process group, torch's first collective with missing ranks
and ours must agree where both give one; the two known differences (docs/metrics.md, "Hangs: compared
with PyTorch's analyzer") are asserted as such, so a new disagreement fails the test.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from pathlib import Path

import pytest

from tracekit.analysis import analyze_run
from tracekit.parse.safe_pickle import load_plain_data

torch_fr = pytest.importorskip("torch.distributed.flight_recorder.components.builder")
config_manager = pytest.importorskip("torch.distributed.flight_recorder.components.config_manager")

FR_ROOT = Path(__file__).resolve().parents[3] / "shared" / "flight_recorder"
SETS = sorted(p for p in FR_ROOT.glob("nvrx_fr_*") if p.is_dir()) if FR_ROOT.is_dir() else []
pytestmark = pytest.mark.skipif(not SETS, reason="shared Flight Recorder dumps not present")


def _torch_first_missing(d: Path) -> dict[str, tuple[int, list[int], str]]:
    details = {}
    for p in d.glob("_dump_*"):
        rank = int(re.search(r"(\d+)$", p.name).group(1))
        doc = load_plain_data(p)
        details[p.name] = {"host_name": f"host_rank{rank}", "rank": rank, "entries": doc["entries"],
                           "version": doc["version"], "pg_config": doc["pg_config"]}
    args = config_manager.JobConfig().parse_args([str(d), "--allow-incomplete-ranks"])
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            db = torch_fr.build_db(details, args, str(next(iter(details.values()))["version"]))
    finally:
        logging.disable(logging.NOTSET)
    first: dict[str, tuple[int, list[int], str]] = {}
    for c in db.collectives:
        if c.missing_ranks and (c.group_id not in first or c.collective_seq_id < first[c.group_id][0]):
            first[c.group_id] = (c.collective_seq_id, sorted(c.missing_ranks), c.collective_name)
    return first


@pytest.mark.parametrize("dump_dir", SETS, ids=[p.name for p in SETS])
def test_agrees_with_pytorch_flight_recorder_analyzer(dump_dir, tmp_path):
    theirs = _torch_first_missing(dump_dir)
    sec = analyze_run(dump_dir, None).analysis["sections"]["hang"]
    groups = {g["pg_name"]: g for g in sec["groups"]}
    ours = {n: (g["stuck"]["seq"], g["stuck"]["missing"]) for n, g in groups.items()
            if g["stuck"] and g["stuck"]["missing"]}
    both = set(theirs) & set(ours)
    assert both, "no group where both analyzers name missing ranks"
    for g in both:
        assert ours[g] == theirs[g][:2], g
    for g in set(theirs) - set(ours):  # torch pairs send/recv as collectives of their group; we pair them
        assert re.search(r":(send|recv) ", theirs[g][2]), (g, theirs[g])
    entries = {}
    for p in dump_dir.glob("_dump_*"):
        entries[int(re.search(r"(\d+)$", p.name).group(1))] = load_plain_data(p)["entries"]
    for g in set(ours) - set(theirs):  # torch's greedy pairing stops at a missing rank's stale entries
        done = groups[g]["completed_by_group"]
        stale = [r for r in ours[g][1] for e in entries[r]
                 if e["process_group"][0] == g and not e["is_p2p"] and e["collective_seq_id"] <= done]
        assert stale, (g, ours[g])
