"""Per-row tests and codes of text columns that are Arrow dictionaries, computed on the dictionary once.

Event names and categories are dictionary columns (a few thousand distinct values over up to millions of
rows): casting them to strings to compare or match each row costs a string per row; the same answer comes
from testing each distinct value once and taking the results by the rows' indices (nulls stay null).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def text_test(col: Any, test: Callable[..., Any], *args: Any) -> Any:
    """test(col as text, *args) (e.g. pc.equal, pc.match_substring_regex): a boolean column, null where
    `col` is null; for a dictionary column computed on its dictionary."""
    if isinstance(col, pa.ChunkedArray):
        return pa.chunked_array([text_test(c, test, *args) for c in col.chunks], pa.bool_())
    if pa.types.is_dictionary(col.type):
        return test(col.dictionary.cast(pa.string()), *args).take(col.indices)
    return test(col.cast(pa.string()), *args)


def codes(col: Any) -> tuple[np.ndarray, list]:
    """(code per row, value per code) of a column: one code per distinct value, null a value (None); a
    dictionary column keeps its own codes when its dictionary holds each value once."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        values = col.dictionary.to_pylist()
        if len(set(values)) == len(values) and None not in values:
            return col.indices.fill_null(len(values)).to_numpy(zero_copy_only=False).astype(np.int64), values + [None]
        col = col.cast(col.type.value_type)
    enc = pc.dictionary_encode(col, null_encoding="encode")
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64), enc.dictionary.to_pylist()


def object_strings(col: Any, null: Any = None) -> np.ndarray:
    """The column's values as a numpy object array of text (`null` for nulls), each distinct value converted
    to a Python string once (`codes`) instead of once per row (`to_pylist`)."""
    row_codes, values = codes(col)
    text = np.empty(len(values), dtype=object)
    text[:] = [null if v is None else str(v) for v in values]
    return text[row_codes]
