"""The step timeline at scale (issue 33): one row per rank beyond 8 ranks, the busiest ranks in full, and
the ranks the user picks (`analyze --timeline-ranks 0-7,12`).

A simulated 64-GPU cluster (`tracekit simulate`, dp 8 x tp 8, rank 13's GPU 1.3x slower: the knob is the
test's knowledge, the analysis never reads it). Checked against plain-Python interval arithmetic on the
per-kind lanes the same analysis draws when every rank is chosen: a rank's row is its compute lane, the
union of its communication lanes less compute, its other and its idle lanes, exclusive, and together they
cover exactly the rank's analysed windows (the breakdown's step_ns).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.config import AnalysisConfig
from tracekit.analyze.breakdown import analyze_breakdown
from tracekit.cli.main import app

REPO = Path(__file__).resolve().parents[2]
SLOW_GPU = 13


@pytest.fixture(scope="module")
def store64(tmp_path_factory):
    from tracekit.parse.run import parse_run

    tmp = tmp_path_factory.mktemp("sim64")
    res = subprocess.run([sys.executable, "-m", "tracekit", "simulate", "--dp", "8", "--tp", "8", "--model", "tiny",
                          "--cluster", "8x8-h100", "--fault", f"slow-gpu={SLOW_GPU}:1.3", "--steps", "2",
                          "--seed", "0", "--out", str(tmp / "traces")], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return parse_run(tmp / "traces", tmp / "store", progress=False).store


def _by_rank_lane(tl) -> dict[int, dict[str, list[tuple[int, int]]]]:
    out: dict[int, dict[str, list[tuple[int, int]]]] = {}
    for r, lane, s, e in tl["intervals"]:
        out.setdefault(r, {}).setdefault(lane, []).append((s, e))
    return out


def _union(spans):
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _minus(a, b):
    """a less b, both sorted disjoint interval lists."""
    out = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


@pytest.mark.slow  # ~15 s on the loaded 2-core box: 64 ranks simulated, parsed, three breakdowns
def test_64_ranks_one_row_each_busiest_in_full(store64):
    bd = analyze_breakdown(store64, None, None, AnalysisConfig())
    tl = bd.section["timeline"]
    every = analyze_breakdown(store64, None, None, AnalysisConfig(timeline_ranks=tuple(range(64)))).section["timeline"]
    assert tl["min_gap_ns"] == every["min_gap_ns"] == 0 and not tl["truncated_ranks"]
    full = {e["rank"]: e["why"] for e in tl["expanded_ranks"]}
    assert len(full) <= 4 and full.get(SLOW_GPU) == "most compute"
    assert sorted(tl["summarised_ranks"]) == sorted(set(range(64)) - set(full)) and tl["chosen_by"] == "busiest"
    got, want = _by_rank_lane(tl), _by_rank_lane(every)
    steps_ns = {r["rank"]: r["step_ns"] for r in bd.section["ranks"]}
    for r in range(64):
        if r in full:
            assert got[r] == want[r]  # the same lanes as when every rank is drawn in full
            continue
        assert set(got[r]) <= {"summary:compute", "summary:comm", "summary:other", "summary:idle"}
        lanes = want[r]
        compute = _union(lanes.get("compute", []))
        comm = _minus(_union([x for k, v in lanes.items() if k.startswith("comm") for x in v]), compute)
        assert _union(got[r].get("summary:compute", [])) == compute
        assert _union(got[r].get("summary:comm", [])) == comm
        assert got[r].get("summary:other", []) == lanes.get("other", [])
        assert got[r].get("summary:idle", []) == lanes.get("idle", [])
        row = [x for v in got[r].values() for x in v]
        assert len(_union(row)) <= len(row) and sum(e - s for s, e in _union(row)) == sum(e - s for s, e in row)
        assert sum(e - s for s, e in row) == steps_ns[r]  # exclusive and covering the analysed windows

    # the report: one row per summarised rank, every rank labelled, far fewer rows than a lane per kind
    from reports import charts
    from reports.html_parts import Figures

    def rows(timeline):
        html = charts.timeline(Figures(), timeline)
        spec = json.loads(re.search(r'<script type="application/json" id="tk-fig-1">(.*?)</script>', html, re.S).group(1))
        return spec["layout"]["yaxis"]["categoryarray"], html

    cats, html = rows(tl)
    all_cats, _ = rows(every)
    labelled = {int(re.match(r"r(\d+)", c).group(1)) for c in cats}
    assert labelled == set(range(64))
    assert len(cats) == 60 + sum(len(want[r]) for r in full) < len(all_cats) / 2
    assert "ranks are drawn as one row each" in html and "--timeline-ranks" in html


@pytest.mark.slow
def test_user_picks_ranks(store64):
    tl = analyze_breakdown(store64, None, None, AnalysisConfig(timeline_ranks=(0, 1, 2, 3, 4, 5, 6, 7, 12, 99)))
    tl = tl.section["timeline"]
    lanes = _by_rank_lane(tl)
    assert sorted(lanes) == [0, 1, 2, 3, 4, 5, 6, 7, 12] and tl["ranks_not_in_run"] == [99]
    assert tl["chosen_by"] == "user" and tl["summarised_ranks"] == []
    assert all("compute" in v and not any(k.startswith("summary:") for k in v) for v in lanes.values())


def test_timeline_ranks_option(tmp_path):
    """`analyze --timeline-ranks` on a 2-rank fixture: only the rank asked for; a bad list is a usage error."""
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["analyze", str(REPO / "fixtures" / "tp"), "--out", str(out), "-q", "-j", "1",
                                   "--timeline-ranks", "1"])
    assert res.exit_code == 0, res.output
    tl = json.loads((out / "analysis.json").read_text())["sections"]["breakdown"]["timeline"]
    assert {iv[0] for iv in tl["intervals"]} == {1} and tl["chosen_by"] == "user"
    res = CliRunner().invoke(app, ["analyze", str(REPO / "fixtures" / "tp"), "--out", str(tmp_path / "o2"),
                                   "--timeline-ranks", "3-1"])
    assert res.exit_code == 2 and "--timeline-ranks" in res.output
