"""The discrete-event core: per rank a host thread issuing ops into device streams, coupled by collectives.

Host: each launching op costs `host` ns on the CPU (its aten op, with the cudaLaunchKernel inside); the
host runs ahead of the device until it reaches a blocking op (SYNC: `.item()` / `cudaStreamSynchronize`)
or until `queue_depth` launches are outstanding. Device: a kernel starts when its stream is free, it
was launched, and (for a collective or send) the compute stream has produced its input (CUDA event
wait at issue). A WAIT makes a stream wait for a collective's end on this rank (work.wait()).

Collectives (NCCL semantics): a member's kernel starts when its stream reaches it (its arrival); every
member ends at last arrival + transfer, transfer = latency + bytes × bus factor ÷ bandwidth of the link
tier the group spans. P2P send/recv are two-member instances with the same rule.

The loop runs each rank until it needs a value that is not known yet (a collective whose last member
has not arrived), parks it on that collective, and resumes it when the collective resolves.
"""

from __future__ import annotations

from collections import deque

KERNEL, COLL, HOST, SYNC, WAIT, MARK, MEMORY = range(7)
COMPUTE_STREAM = 7


class Coll:
    """One collective / P2P instance shared by its members."""

    __slots__ = ("key", "op", "pg", "members", "starts", "end", "lat_ns", "ns_per_byte", "bytes", "waiters",
                 "seq", "nelems", "dtype", "splits")

    def __init__(self, key, op, pg, members, lat_ns, ns_per_byte, seq=None):
        self.key = key
        self.op = op
        self.pg = pg
        self.members = members
        self.starts: dict[int, int] = {}
        self.end: int | None = None
        self.lat_ns = lat_ns
        self.ns_per_byte = ns_per_byte
        self.bytes = 0.0  # bus bytes (already × factor); the max over members
        self.waiters: list[int] = []
        self.seq = seq
        self.nelems: dict[int, tuple[int, int]] = {}
        self.dtype = "BFloat16"
        self.splits: dict[int, tuple[list[int], list[int]]] = {}


class Op:
    """One host-issued operation. Times (ns) are filled by the engine: h0/h1 host, d0/d1 device."""

    __slots__ = ("kind", "name", "kname", "stream", "dur", "host", "coll", "cat", "step", "h0", "h1", "d0", "d1",
                 "peer", "extra")

    def __init__(self, kind, name, kname=None, stream=COMPUTE_STREAM, dur=0, host=0, coll=None, cat="kernel",
                 step=0, peer=None, extra=None):
        self.kind = kind
        self.name = name
        self.kname = kname
        self.stream = stream
        self.dur = dur
        self.host = host
        self.coll = coll
        self.cat = cat
        self.step = step
        self.peer = peer
        self.extra = extra
        self.h0 = self.h1 = self.d0 = self.d1 = 0


class Deadlock(RuntimeError):
    pass


def run(programs: list[list[Op]], t0: int, queue_depth: int = 1024) -> None:
    """Fill the times of every op of every rank's program (in place)."""
    n = len(programs)
    host = [t0] * n
    pc = [0] * n
    streams: list[dict[int, object]] = [{} for _ in range(n)]  # stream -> end ns (int) or pending Coll
    launched: list[deque] = [deque() for _ in range(n)]
    ready = deque(range(n))
    parked = [False] * n
    done = 0
    while ready:
        r = ready.popleft()
        parked[r] = False
        blocked = _advance(r, programs[r], pc, host, streams[r], launched[r], queue_depth)
        if blocked is None:
            done += 1
        elif blocked.end is not None:  # resolved meanwhile
            ready.append(r)
        elif not parked[r]:
            parked[r] = True
            blocked.waiters.append(r)
        for w in _resolved:
            for x in w.waiters:
                ready.append(x)
            w.waiters = []
        _resolved.clear()
    if done != n or any(pc[r] < len(programs[r]) for r in range(n)):
        stuck = [r for r in range(n) if pc[r] < len(programs[r])]
        r = stuck[0]
        op = programs[r][pc[r]]
        raise Deadlock(f"{len(stuck)} ranks cannot finish; rank {r} waits at {op.name} "
                       f"({op.coll.key if op.coll else ''})")


_resolved: list[Coll] = []


def _free(streams: dict, s: int, rank: int):
    """End of the last op on stream s, or the pending Coll that blocks knowing it."""
    v = streams.get(s, 0)
    if isinstance(v, int):
        return v
    if v.end is None:
        return v
    streams[s] = v.end
    return v.end


def _arrive(c: Coll, rank: int, t: int) -> None:
    c.starts[rank] = t
    if len(c.starts) == len(c.members):
        c.end = max(c.starts.values()) + c.lat_ns + int(c.bytes * c.ns_per_byte)
        _resolved.append(c)


def _advance(r, prog, pc, host, streams, launched, qd):
    """Run rank r until it finishes (None) or needs a pending collective (returned)."""
    i = pc[r]
    h = host[r]
    nprog = len(prog)
    while i < nprog:
        op = prog[i]
        k = op.kind
        if k == KERNEL or k == COLL:
            if len(launched) >= qd:
                old = launched[0]
                if old.kind == COLL and old.coll.end is None:
                    pc[r], host[r] = i, h
                    return old.coll
                h = max(h, old.coll.end if old.kind == COLL else old.d1)
                launched.popleft()
            s = op.stream
            fs = _free(streams, s, r)
            if not isinstance(fs, int):
                pc[r], host[r] = i, h
                return fs
            if k == COLL:
                fc = _free(streams, COMPUTE_STREAM, r)
                if not isinstance(fc, int):
                    pc[r], host[r] = i, h
                    return fc
                op.h0 = h
                h += op.host
                op.h1 = h
                start = h if h > fs else fs
                if fc > start:
                    start = fc
                op.d0 = start
                _arrive(op.coll, r, start)
                streams[s] = op.coll
            else:
                op.h0 = h
                h += op.host
                op.h1 = h
                start = h if h > fs else fs
                op.d0 = start
                op.d1 = start + op.dur
                streams[s] = op.d1
            launched.append(op)
        elif k == WAIT:
            c = op.coll
            if c.end is None:
                pc[r], host[r] = i, h
                return c
            fs = _free(streams, op.stream, r)
            if not isinstance(fs, int):
                pc[r], host[r] = i, h
                return fs
            op.h0 = h
            h += op.host
            op.h1 = h
            op.d0 = op.d1 = max(fs, c.end)
            streams[op.stream] = op.d1
        elif k == SYNC:
            end = 0
            for s in list(streams):
                fs = _free(streams, s, r)
                if not isinstance(fs, int):
                    pc[r], host[r] = i, h
                    return fs
                if fs > end:
                    end = fs
            op.h0 = h
            op.d0 = max(h, end)
            h = op.d0 + op.host
            op.h1 = h
            launched.clear()
        else:  # HOST, MARK, MEMORY
            op.h0 = h
            h += op.host
            op.h1 = h
        i += 1
    pc[r], host[r] = i, h
    return None


def finish_colls(programs: list[list[Op]]) -> None:
    """Copy each collective's end into its members' ops (d1)."""
    for prog in programs:
        for op in prog:
            if op.kind == COLL:
                op.d1 = op.coll.end
