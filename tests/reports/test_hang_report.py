"""The report's Hang post-mortem lays out the `hang` section as given, with every trace string escaped."""

from __future__ import annotations

from reports.hang import hang_html
from reports.html_parts import Figures

EVIL = '<img src=x onerror="alert(1)">'


def _section() -> dict:
    stuck = {"op": "all_to_all", "name": EVIL, "seq": 7, "in_sizes": "2048x5120", "out_sizes": "2048x5120",
             "dtype": "BFloat16", "state": "scheduled", "entered": [0, 2], "missing": [1], "no_dump": [],
             "waiting": [0, 2]}
    return {"hung": True, "dumps": {"ranks": [0, 1, 2], "empty": [1], "dead": [], "no_dump": []},
            "groups": [{"pg_name": "72", "pg_desc": EVIL, "ranks": [0, 1, 2], "stuck": stuck, "mismatches": [],
                        "members": [{"rank": r, "last_enqueued": 7, "last_started": -1, "last_completed": 6}
                                    for r in (0, 2)]}],
            "p2p_unmatched": [], "waits": [{"rank": 0, "waits_for": [1]}],
            "last_entered": [{"rank": 0, "op": "all_to_all", "seq": 7, "pg_name": EVIL, "enqueue_ts": 10},
                             {"rank": 1, "op": None, "enqueue_ts": None}],
            "root_causes": [{"ranks": [1], "kind": "missing", "blocked_ranks": [0, 2],
                             "collective": {"pg_name": "72", "pg_desc": EVIL, **stuck},
                             "last_entries": {}, "frames": {"1": f"train.py:12 {EVIL}"}}]}


def test_hang_section_shows_the_root_cause_and_escapes_trace_strings():
    html = hang_html(_section(), Figures())
    assert EVIL not in html and "&lt;img" in html
    assert "Root cause 1: rank(s) 1" in html and "never entered the collective" in html
    assert "all_to_all #7" in html and "2048x5120" in html
    assert "Ranks whose dump holds no entry: 1" in html


def test_no_section_without_dumps():
    assert hang_html(None) == "" and hang_html({}) == ""
