"""A value every task of one `map_ranks` call reads alike (the layout's pg_name -> dim map, as large as the run's
groups: 13,451 entries at 10,000 ranks), sent to each worker process once instead of pickled with every task.

An engine's `shared(value)` (a context manager) gives a small picklable handle for the tasks' arguments; a task
reads the value with `shared_value(handle)`, loaded once per worker process and kept while the handle is the
latest one it saw. The local engine writes the value to a temporary file its workers (same machine) read;
the Ray engine puts it in the object store (`ray.put`) once. The file holds plain data as MessagePack
(msgspec): a worker decodes it, nothing is unpickled. An engine without `shared` (or one running tasks
in this process) passes the value itself, which `shared_value` returns as it is.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import msgspec


@dataclass(frozen=True)
class SharedFile:
    """A value (plain data: dicts, lists, strings, numbers) written to `path` as MessagePack (removed when the engine's `shared` block ends); `token` tells it from a later
    value at a path the system reused."""
    path: str
    token: str

    def key(self) -> str:
        return f"file:{self.path}:{self.token}"

    def load(self) -> Any:
        with open(self.path, "rb") as f:
            return msgspec.msgpack.decode(f.read())


@dataclass(frozen=True)
class SharedRef:
    """A value in Ray's object store. The reference is kept inside a tuple: Ray resolves only references
    passed as a task's own arguments, so this one travels as a reference and is fetched once per worker."""
    refs: tuple

    def key(self) -> str:
        return f"ray:{self.refs[0].hex()}"

    def load(self) -> Any:
        import ray

        return ray.get(self.refs[0])


_HELD: dict[str, Any] = {}
"""The shared value this worker process loaded last, by its handle's key (one held at a time)."""


def shared_value(handle: Any) -> Any:
    """The value behind `handle` (loaded once per process), or `handle` itself when it is not a handle."""
    if not isinstance(handle, (SharedFile, SharedRef)):
        return handle
    key = handle.key()
    if key not in _HELD:
        _HELD.clear()
        _HELD[key] = handle.load()
    return _HELD[key]


@contextlib.contextmanager
def shared_file(value: Any) -> Iterator[SharedFile]:
    """`value` written to a temporary file for the block (the local engine's worker processes read it)."""
    fd, path = tempfile.mkstemp(prefix="tk-shared-", suffix=".msgpack")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.msgpack.encode(value))
        yield SharedFile(path, uuid.uuid4().hex)
    finally:
        os.unlink(path)


def engine_shared(engine: Any, value: Any) -> contextlib.AbstractContextManager:
    """`engine.shared(value)`, or the value itself for an engine without it."""
    shared = getattr(engine, "shared", None)
    return shared(value) if shared is not None else contextlib.nullcontext(value)
