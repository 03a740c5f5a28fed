"""Write tests/test_costs.json (the order in which scripts/test.sh's workers take test files, longest first)
from a JUnit XML of a whole-suite run:

    bash scripts/test.sh --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/test_costs.py /tmp/suite.xml

Seconds per test file (setup, call and teardown of its tests); the `split` entries already in the file are
kept. Only the order of the files depends on these numbers, never a test's outcome.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COSTS = REPO / "tests" / "test_costs.json"


def file_of(classname: str) -> str | None:
    """'tests.analyze.test_x.TestY' -> 'tests/analyze/test_x.py' (the longest prefix that is a file)."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        path = "/".join(parts[:n]) + ".py"
        if (REPO / path).is_file():
            return path
    return None


def main(xml_path: str) -> None:
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        path = file_of(case.get("classname", ""))
        if path is not None:
            seconds[path] += float(case.get("time", 0.0))
    old = json.loads(COSTS.read_text()) if COSTS.is_file() else {}
    doc = {"about": old.get("about", ""), "split": old.get("split", {}),
           "seconds": {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}}
    COSTS.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{COSTS}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")


if __name__ == "__main__":
    main(sys.argv[1])
