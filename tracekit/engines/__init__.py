"""Where per-rank work runs: `local` (a process pool, the default) or `ray` (a Ray cluster).

An engine parses Kineto files (`parse_kineto_files`, yielding results in submission order with at
most a few files in flight) and maps per-rank analysis tasks (`map_ranks`); the cross-rank steps
run in the calling process, but for those that need only the store and the layout, which the local
engine's running pool may take (`submit`, runner.measure) while the calling process goes on. Both
engines run the same task functions, so they produce the same tables and the same analysis.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol


class Engine(Protocol):
    workers: int

    def parse_kineto_files(self, paths: list[str], *, max_decompressed_bytes: int | None = None,
                           max_memory_bytes: int | None = None) -> Iterator[tuple[str, Any, str | None]]: ...

    def map_ranks(self, fn: Callable[..., Any], args: list[tuple]) -> Iterator[Any]: ...

    def close(self) -> None: ...


ENGINES = ("local", "ray")


def make_engine(name: str, *, workers: int = 1, address: str | None = None, auto: bool = False) -> Engine:
    """`local` or `ray` (address None: start a local Ray instance with `workers` CPUs). `auto`: the
    worker count was not chosen by the user, so the local engine may use fewer (files, free memory)."""
    if name == "local":
        if address:
            raise ValueError("--address only applies to --engine ray")
        from tracekit.engines.local import LocalEngine

        return LocalEngine(workers=workers, auto=auto)
    if name == "ray":
        from tracekit.engines.ray_engine import RayEngine

        return RayEngine(address=address, num_cpus=workers)
    raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}")
