"""A generator of multi-rank GPU Kineto traces whose communication kernels are not NCCL's: DeepEP-like
expert-parallel dispatch / combine / notify kernels (names as DeepEP's sources spell them:
`deep_ep::intranode::dispatch<...>`, `deep_ep::internode_ll::combine<...>`, `deep_ep::intranode::notify_dispatch<...>`)
on a communication stream, overlapping compute kernels on the compute stream — or any kernel names a test
passes. No `record_param_comms`, no collective args: only the kernel names say what is communication.

Each step: the compute stream runs `compute_per_step` kernels back to back (random durations, seeded),
the comm stream runs notify → dispatch → combine at random offsets inside the step (so part of each
overlaps compute and part does not), and the next step starts after both streams are done plus a gap.
The answers (window, comm union, comm ∩ compute) are computed from the intervals laid here with integer
arithmetic (`Layout.comm_share`), never read from tracekit.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

BASE_NS = 1_763_000_000_000_000_000
COMPUTE_STREAM, COMM_STREAM = 7, 24
DEEPEP_NAMES = (
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int, int, bool const*)",
    "void deep_ep::intranode::dispatch<8, 768, 6144>(int4*, float*, int*, long*, float*, int*, int*, int4 const*)",
    "void deep_ep::internode_ll::combine<7168, 9>(void*, void*, int*, void*, void const*, long const*)",
)


@dataclass
class Layout:
    world: int
    steps: int
    comm_names: tuple[str, ...] = DEEPEP_NAMES
    compute_per_step: int = 6
    seed: int = 7
    kernels: dict[int, list[tuple[int, int, int, str, bool, int]]] = field(default_factory=dict)
    """rank -> (step, ts, end, name, is_comm, stream)."""

    def build(self) -> "Layout":
        rnd = random.Random(self.seed)
        for r in range(self.world):
            t = 10_000_000
            out = []
            for s in range(self.steps):
                lo = t
                cur = lo
                for _ in range(self.compute_per_step):
                    d = rnd.randrange(200_000, 900_000)
                    out.append((s, cur, cur + d, "void at::native::elementwise_kernel<128, 4>(int, float*)", False,
                                COMPUTE_STREAM))
                    cur += d + rnd.randrange(0, 50_000)
                end_compute = cur
                c = lo + rnd.randrange(0, 300_000)
                for name in self.comm_names:
                    d = rnd.randrange(100_000, 1_200_000)
                    out.append((s, c, c + d, name, True, COMM_STREAM))
                    c += d + rnd.randrange(0, 200_000)
                t = max(end_compute, c) + rnd.randrange(100_000, 400_000)
            self.kernels[r] = out
        return self

    def windows(self, rank: int) -> list[tuple[int, int]]:
        """GPU step windows: first kernel of step N to the next step's first kernel (last: its last end)."""
        ks = self.kernels[rank]
        first = {s: min(k[1] for k in ks if k[0] == s) for s in range(self.steps)}
        last = max(k[2] for k in ks if k[0] == self.steps - 1)
        return [(first[s], first[s + 1] if s + 1 < self.steps else last) for s in range(self.steps)]

    def comm_share(self, rank: int) -> tuple[int, int, int]:
        """(window ns, comm ns, comm-while-computing ns) over the steps of one rank."""
        ks = self.kernels[rank]
        comm = _union([(k[1], k[2]) for k in ks if k[4]])
        comp = _union([(k[1], k[2]) for k in ks if not k[4]])
        span = sum(hi - lo for lo, hi in self.windows(rank))
        comm_ns = sum(b - a for a, b in comm)
        both = sum(max(0, min(b, d) - max(a, c)) for a, b in comm for c, d in comp)
        return span, comm_ns, both


def _union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def write(layout: Layout, out: Path) -> Path:
    """One `rank{R}.pt.trace.json.gz` per rank: ProfilerStep annotations, a cpu_op + cudaLaunchKernel per
    kernel (correlation ids), the kernels. Timestamps as exact µs text with ns fractions."""
    out.mkdir(parents=True, exist_ok=True)
    for r, ks in layout.kernels.items():
        pid, tid = 100 + r, 100 + r
        ev: list[str] = []

        def x(cat, name, p, t, ts, dur, args):
            ev.append('{"ph": "X", "cat": %s, "name": %s, "pid": %d, "tid": %d, "ts": %s, "dur": %s, "args": %s}'
                      % (json.dumps(cat), json.dumps(name), p, t, _us(BASE_NS + ts), _us(dur), json.dumps(args)))

        corr = 1
        host_first: dict[int, int] = {}
        host_last: dict[int, int] = {}
        for s, ts, end, name, is_comm, stream in sorted(ks, key=lambda k: k[1]):
            h = ts - 50_000  # the host launches each kernel 50 µs before it starts
            host_first.setdefault(s, h - 1_000)
            host_last[s] = h + 10_000
            x("cpu_op", "deep_ep::dispatch" if is_comm else "aten::add", pid, tid, h, 10_000, {"External id": corr})
            x("cuda_runtime", "cudaLaunchKernel", pid, tid, h + 2_000, 5_000, {"correlation": corr, "External id": corr})
            x("kernel", name, 0, stream, ts, end - ts, {"device": 0, "stream": stream, "correlation": corr})
            corr += 1
        for s in sorted(host_first):
            hi = host_first.get(s + 1, host_last[s] + 1_000)
            x("user_annotation", f"ProfilerStep#{s}", pid, tid, host_first[s], hi - host_first[s], {})
        doc = ('{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": %d, "world_size": %d}, '
               '"deviceProperties": [{"id": 0, "name": "NVIDIA H800"}], "traceEvents": [%s]}'
               % (r, layout.world, ", ".join(ev)))
        (out / f"rank{r}.pt.trace.json.gz").write_bytes(gzip.compress(doc.encode(), compresslevel=1))
    return out
