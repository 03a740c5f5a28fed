"""tables/arrow_env.py: parsing does not import pandas, and pandas semantics come back when it is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json, sys
import pyarrow as pa
from tracekit.parse.run import parse_run
store = parse_run(sys.argv[1], sys.argv[2], progress=False).store
after_parse = "pandas" in sys.modules
import numpy as np
import pandas as pd
nan_nulls = pa.array(pd.Series([1.0, np.nan])).null_count
cat_type = str(pa.array(pd.Categorical(["a", "b", "a"])).type)
print(json.dumps({"after_parse": after_parse, "ranks": store.ranks(), "nan_nulls": nan_nulls, "cat": cat_type}))
"""


def test_parse_without_pandas_then_pandas_semantics(tmp_path):
    trace = REPO / "fixtures" / "gpu_h100"
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(trace), str(tmp_path / "store")], capture_output=True,
                         text=True, check=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["after_parse"] is False  # pyarrow did not import pandas for the parse or the store
    assert got["ranks"]  # the parse produced ranks
    # pandas imported afterwards: pyarrow converts as pandas' integration does (NaN -> null, Categorical -> dictionary)
    assert got["nan_nulls"] == 1
    assert got["cat"].startswith("dictionary<values=string")
