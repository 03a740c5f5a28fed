"""A table left on local disk as Arrow IPC stream files, read back one file at a time.

The chunked parser (parse/chunked.py) spills each chunk's events; handing the writer those files
instead of one concatenated table keeps a big trace's events out of memory: each part is
memory-mapped, written to the store and unmapped before the next (bounded memory, not just bounded
anonymous memory: mapped file pages count in a process's resident set too).
"""

from __future__ import annotations

import os
import shutil
import weakref
from dataclasses import dataclass, field
from typing import Iterator

import pyarrow as pa


@dataclass(eq=False)
class SpilledTable:
    """Parts of one table in file order; `workdir` (owned) is removed once the parts are read or the
    object is collected, so a consumer that fails midway leaves nothing behind."""

    paths: list[str]
    schema: pa.Schema
    num_rows: int
    workdir: str | None = None
    _cleanup: weakref.finalize | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.workdir is not None:
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.workdir, True)

    def __getstate__(self) -> dict:
        # handed to another process on this machine (the local pool's parent): the receiver owns the files
        state = dict(self.__dict__)
        if self._cleanup is not None:
            self._cleanup.detach()
        state["_cleanup"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    @property
    def column_names(self) -> list[str]:
        return self.schema.names

    def parts(self) -> Iterator[pa.Table]:
        """Each part memory-mapped (zero copy); its file is unlinked once mapped. Single use."""
        try:
            for p in self.paths:
                with pa.memory_map(p) as src:
                    part = pa.ipc.open_stream(src).read_all()
                os.unlink(p)
                yield part
                del part
        finally:
            self.close()

    def read_all(self) -> pa.Table:
        parts = list(self.parts())
        return pa.concat_tables(parts) if parts else self.schema.empty_table()

    def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup()


def table_parts(table: "pa.Table | SpilledTable") -> Iterator[pa.Table]:
    """The parts of a spilled table, or the table itself."""
    if isinstance(table, SpilledTable):
        yield from table.parts()
    else:
        yield table
