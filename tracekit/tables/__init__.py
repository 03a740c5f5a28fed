"""Typed tables (DESIGN §2) and the on-disk run store."""

from tracekit.tables.schema import TABLES, STEP_PATTERN, conform, empty
from tracekit.tables.store import RunStore, RunStoreWriter

__all__ = ["TABLES", "STEP_PATTERN", "conform", "empty", "RunStore", "RunStoreWriter"]
