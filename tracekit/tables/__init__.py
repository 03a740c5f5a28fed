"""Typed tables (DESIGN §2) and the on-disk run store."""

from typing import Any

from tracekit.tables.schema import TABLES, STEP_PATTERN, conform, empty

__all__ = ["TABLES", "STEP_PATTERN", "conform", "empty", "RunStore", "RunStoreWriter"]


def __getattr__(name: str) -> Any:
    # the store pulls in pyarrow.dataset (and with it pandas, ~0.3 s): parse workers only need the schema
    if name in ("RunStore", "RunStoreWriter"):
        from tracekit.tables import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
