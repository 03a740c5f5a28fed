"""`--engine ray`: the same per-rank parse and analysis tasks as tasks on a Ray cluster.

Workers read the trace files and the run store by path, so on a multi-node cluster both must be on
storage every node sees, and tracekit must be installed on every node. Tables come back through
Ray's object store (Arrow buffers, zero copy on the same node). With no address a local Ray
instance is started (dashboard off, usage stats off, a short temp dir) and stopped on close; an
instance already initialised in this process is reused and left running.

Ray 2.60 turns token authentication on by default: a client of a `ray start` head that disagrees
about it fails with a bare ConnectionError, so that error is re-raised with the fix.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from tracekit.errors import TracekitError
from tracekit.parse.pool import ParseJob, run_job


class RayEngineError(TracekitError):
    """Ray is missing or the cluster cannot be reached."""


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _call(fn: Callable[..., Any], args: tuple) -> tuple[str, Any]:
    """(the node that ran it, fn(*args))."""
    return _node_id(), fn(*args)


def _parse(job: ParseJob) -> tuple[str, Any]:
    return _node_id(), run_job(job)


_STANDARD_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def node_label(node: dict[str, Any]) -> str:
    """A node of `ray.nodes()` by its custom resources (`node1`), else by address and id."""
    custom = sorted(k for k in node.get("Resources", {}) if k not in _STANDARD_RESOURCES and ":" not in k)
    return "+".join(custom) if custom else f"{node.get('NodeManagerAddress', '?')}/{node.get('NodeID', '?')[:8]}"


@dataclass
class RayEngine:
    address: str | None = None
    """Ray cluster address (e.g. 10.0.0.1:6379 or ray://host:10001); None starts a local instance."""
    num_cpus: int = 1
    """CPUs of a local instance (ignored with an address; the cluster decides)."""
    workers: int = field(default=0, init=False)
    _started: bool = field(default=False, init=False, repr=False)
    _remote: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    budget: Any = None
    """--max-memory (MemoryBudget): bounds this process (the prefetched activities); each parse task on
    the cluster gets the whole budget as its own."""
    tasks_by_node: Counter = field(default_factory=Counter, init=False)
    """Tasks run per node id (parse and per-rank tasks): which nodes did the work."""
    pandas_free = False
    """Ray's own code may import pandas while it runs our jobs (parse_run keeps it importable)."""

    def __post_init__(self) -> None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            import ray
        except ImportError:
            raise RayEngineError("--engine ray needs ray: pip install 'tracekit[ray]'") from None
        self._ray = ray
        if not ray.is_initialized():
            try:
                if self.address:
                    ray.init(address=self.address, log_to_driver=False)
                else:
                    self._start_local(ray)
            except ConnectionError as exc:
                raise RayEngineError(
                    f"cannot connect to the Ray cluster at {self.address}: {exc}. Ray 2.60 uses token auth by "
                    "default: set RAY_AUTH_MODE=token here (with the head's ~/.ray/auth_token) or start the head "
                    "with RAY_AUTH_MODE=disabled") from None
            self._started = True
        self.workers = max(int(ray.cluster_resources().get("CPU", 1)), 1)
        self._remote["parse"] = ray.remote(num_cpus=1, max_retries=1)(_parse)
        self._remote["call"] = ray.remote(num_cpus=1, max_retries=1)(_call)

    def _start_local(self, ray: Any, attempts: int = 3) -> None:
        """A local instance. On a loaded machine Ray's agent can miss the raylet's fixed 15 s start-up
        wait (ray-project/ray#65983) and the start fails; that is retried, other errors are not."""
        for attempt in range(attempts):
            temp = tempfile.mkdtemp(prefix="tkray-", dir="/tmp")  # unix socket paths must stay short
            try:
                ray.init(num_cpus=self.num_cpus, include_dashboard=False, _temp_dir=temp, log_to_driver=False)
                return
            except Exception as exc:  # ray raises a bare Exception for a start-up timeout
                ray.shutdown()
                if "timed out during startup" not in str(exc) or attempt == attempts - 1:
                    raise RayEngineError(f"could not start a local Ray instance: {exc}") from None

    def _ordered(self, submit: Callable[[Any], Any], items: list[Any]) -> Iterator[Any]:
        """Results in submission order with at most 2 tasks per CPU in flight (bounded driver memory)."""
        pending: deque = deque()
        todo = iter(items)
        for it in todo:
            pending.append(submit(it))
            if len(pending) >= 2 * self.workers:
                break
        while pending:
            node, result = self._ray.get(pending.popleft())
            self.tasks_by_node[node] += 1
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(submit(nxt))
            yield result

    def tasks_by_node_label(self) -> dict[str, int]:
        """`tasks_by_node` keyed by node label (node_label), every node of the cluster listed."""
        labels = {n["NodeID"]: node_label(n) for n in self._ray.nodes() if n.get("Alive", True)}
        out = {label: 0 for label in sorted(labels.values())}
        for node, n in self.tasks_by_node.items():
            key = labels.get(node, node[:8])
            out[key] = out.get(key, 0) + n
        return out

    def describe(self) -> str | None:
        """One line for the console: tasks per node (JSON), or None before any task ran."""
        if not self.tasks_by_node:
            return None
        import json

        return f"ray tasks by node: {json.dumps(self.tasks_by_node_label())}"

    def parse_kineto_files(self, paths: list[str], *, max_decompressed_bytes: int | None = None,
                           max_memory_bytes: int | None = None) -> Iterator[tuple[str, Any, str | None]]:
        remote = self._remote["parse"]
        given = {os.path.abspath(p): p for p in paths}  # workers get absolute paths; results name them as given
        jobs = [ParseJob(a, max_decompressed_bytes, max_memory_bytes, None) for a in given]
        for path, kp, err, _ in self._ordered(remote.remote, jobs):
            yield given.get(path, path), kp, err

    def map_ranks(self, fn: Callable[..., Any], args: list[tuple]) -> Iterator[Any]:
        remote = self._remote["call"]
        return self._ordered(lambda a: remote.remote(fn, a), args)

    @contextlib.contextmanager
    def shared(self, value: Any) -> Iterator[Any]:
        """A handle to `value` for `map_ranks`' tasks (tracekit/engines/shared.py): put in the object store once,
        fetched once per worker."""
        from tracekit.engines.shared import SharedRef

        yield SharedRef((self._ray.put(value),))

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False
