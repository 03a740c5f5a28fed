"""Loads pickles that may hold only plain data (dicts, lists, tuples, str, bytes, numbers, bool, None).

Flight Recorder can dump its buffer as a pickle; a pickle can name any importable callable and run
it while loading, so an untrusted dump is never given to `pickle.load`. Two walls: the opcode stream
is scanned first and any opcode that imports or calls is refused with the offending opcode named,
and the loader's `find_class` / `persistent_load` refuse everything in case the scan missed a path.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from pathlib import Path

from tracekit.errors import UnsafeInputError
from tracekit.errors import InputTooLargeError

# Opcodes that import a global, call a callable or build/extend a class instance.
FORBIDDEN_OPCODES = frozenset({
    "GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "REDUCE", "BUILD",
    "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID", "READONLY_BUFFER", "NEXT_BUFFER",
})

PICKLE_MAGIC = b"\x80"  # protocol 2+ pickles start with PROTO


class _PlainDataUnpickler(pickle.Unpickler):
    """An Unpickler that resolves no globals and no persistent ids."""

    def __init__(self, file: io.BytesIO, source: str) -> None:
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str):  # noqa: D401 - pickle API
        raise UnsafeInputError(self._source, f"pickle refers to {module}.{name}; only plain data is accepted")

    def persistent_load(self, pid: object):
        raise UnsafeInputError(self._source, "pickle uses persistent ids; only plain data is accepted")


def check_plain_data_pickle(data: bytes, source: str = "<bytes>") -> None:
    """Raise UnsafeInputError if the opcode stream imports, calls or builds anything."""
    try:
        for opcode, _arg, pos in pickletools.genops(data):
            if opcode.name in FORBIDDEN_OPCODES:
                raise UnsafeInputError(source, f"pickle opcode {opcode.name} at byte {pos} would import or call code; refused")
    except UnsafeInputError:
        raise
    except Exception as exc:  # malformed stream: genops raises ValueError and friends
        raise UnsafeInputError(source, f"not a readable pickle ({exc})") from None


def loads_plain_data(data: bytes, source: str = "<bytes>") -> object:
    """Unpickle `data` if (and only if) it holds plain containers and scalars."""
    check_plain_data_pickle(data, source)
    try:
        return _PlainDataUnpickler(io.BytesIO(data), source).load()
    except UnsafeInputError:
        raise
    except Exception as exc:
        raise UnsafeInputError(source, f"pickle could not be loaded as plain data ({exc})") from None


def load_plain_data(path: str | Path, max_bytes: int | None = None) -> object:
    """Read and safely unpickle the file at `path` (optionally refusing files over `max_bytes`)."""
    path = Path(path)
    if max_bytes is not None and path.stat().st_size > max_bytes:
        raise InputTooLargeError(str(path), f"pickle is {path.stat().st_size} bytes, over the {max_bytes}-byte budget")
    return loads_plain_data(path.read_bytes(), str(path))


def looks_like_pickle(head: bytes) -> bool:
    """True for the first bytes of a protocol-2+ pickle (PROTO opcode then a protocol number)."""
    return len(head) >= 2 and head[:1] == PICKLE_MAGIC and 2 <= head[1] <= 5
