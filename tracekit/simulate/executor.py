"""The discrete-event core: per rank a host thread issuing ops into device streams, coupled by collectives.

Host: each launching op costs `host` ns on the CPU (its aten op, with the cudaLaunchKernel inside); the
host runs ahead of the device until it reaches a blocking op (SYNC: `.item()` / `cudaStreamSynchronize`)
or until `queue_depth` launches are outstanding on the stream it launches into. Per stream: with one
queue for all streams, a collective waiting for a late peer on a comm stream held back the launches on
the compute stream that the peer's progress needed (a cross-rank deadlock of 70B-size pipelines with
ring attention at 1024 launches). Device: a kernel starts when its stream is free, it was launched, and
(for a collective or send) the compute stream has produced its input (CUDA event wait at issue). A WAIT
makes a stream wait for a collective's end on this rank (work.wait()).

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
                 "seq", "nelems", "dtype", "splits", "retired", "late")

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
        self.retired = 0
        """members whose op `run(retire=...)` handed out (a streamed run drops the instance when all have)"""
        self.late = None
        """(rank, ns) of `late_arrival`, once computed"""


class Op:
    """One host-issued operation. Times (ns) are filled by the engine: h0/h1 host, d0/d1 device (-1: not yet)."""

    __slots__ = ("kind", "name", "kname", "stream", "dur", "host", "coll", "cat", "step", "h0", "h1", "d0", "d1",
                 "peer", "extra", "dep")

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
        self.h0 = self.h1 = 0
        self.d0 = self.d1 = -1
        self.dep = None


class Deadlock(RuntimeError):
    pass


class _RankState:
    __slots__ = ("prog", "pc", "h", "queues", "free", "launched", "unresolved", "last_compute", "queued", "more")

    def __init__(self, prog, t0):
        self.prog = prog
        self.pc = 0
        self.h = t0
        self.queues: dict[int, deque] = {}
        self.free: dict[int, int] = {}
        self.launched: dict[int, deque] = {}
        """per stream, its launches not yet known finished (at most `queue_depth`)"""
        self.unresolved = 0
        self.last_compute = None
        self.queued = True
        self.more = False
        """whether `feed` may still append ops to prog (a streamed run)"""


def run(programs: list[list[Op]], t0: int, queue_depth: int = 1024, *, feed=None, retire=None) -> None:
    """Fill the times of every op of every rank's program (in place).

    Each rank alternates a host pass (issue ops in program order until a SYNC needs unfinished device work,
    or the launch queue is full) and a device pass (start each stream's head op once what it waits for is
    known). A rank that can do neither waits on the collectives blocking it and resumes when one resolves.

    A streamed run (bounded memory at 10,000 ranks): `feed(r)` appends the next ops of rank r's program to
    programs[r] when its host has issued all it holds (False once the program is complete), and
    `retire(r, ops)` receives each rank's finished prefix (every time final: issued, and off the device for
    device ops) in program order, which is then deleted from programs[r]. The times are those of the run
    with the whole programs given at once: each op's times depend only on its own rank's earlier ops and on
    its collectives' last arrival, never on the order in which ranks are stepped."""
    states = [_RankState(p, t0) for p in programs]
    if feed is not None:
        for st in states:
            st.more = True
    ready = deque(range(len(programs)))
    while ready:
        r = ready.popleft()
        st = states[r]
        st.queued = False
        blockers = _progress(r, st, queue_depth, feed)
        if retire is not None:
            _retire(r, st, retire)
        for c in _resolved:
            for x in c.waiters:
                if not states[x].queued:
                    states[x].queued = True
                    ready.append(x)
            c.waiters = []
        _resolved.clear()
        if blockers:
            if any(c.end is not None for c in blockers):
                if not st.queued:
                    st.queued = True
                    ready.append(r)
            else:
                for c in blockers:
                    c.waiters.append(r)
    stuck = [r for r, st in enumerate(states) if st.pc < len(st.prog) or st.unresolved or st.more]
    if stuck:
        st = states[stuck[0]]
        op = st.prog[min(st.pc, len(st.prog) - 1)]
        heads = [q[0].coll.key for q in st.queues.values() if q and q[0].coll is not None]
        raise Deadlock(f"{len(stuck)} ranks cannot finish; rank {stuck[0]} is at {op.name}, its streams wait on {heads[:4]}")


_resolved: list[Coll] = []


def _arrive(c: Coll, rank: int, t: int) -> None:
    c.starts[rank] = t
    if len(c.starts) == len(c.members):
        c.end = max(c.starts.values()) + c.lat_ns + int(c.bytes * c.ns_per_byte)
        _resolved.append(c)


def _retire(r: int, st: _RankState, retire) -> None:
    """Hand the finished prefix of rank r's program to `retire` and drop it from the program."""
    prog, pc = st.prog, st.pc
    k = 0
    while k < pc:
        op = prog[k]
        kind = op.kind
        if (kind == KERNEL or kind == COLL or kind == WAIT) and op.d1 < 0:
            break
        k += 1
    if k:
        retire(r, prog[:k])
        del prog[:k]
        st.pc = pc - k


def _progress(r: int, st: _RankState, qd: int, feed=None) -> set | None:
    """Run rank r as far as it goes; None when finished, else the pending collectives it waits on."""
    blockers: set = set()
    changed = True
    while changed:
        changed = _host(st, qd)
        while st.more and st.pc >= len(st.prog):  # the host issued all it holds: build on until it blocks
            st.more = feed(r)
            changed = _host(st, qd) or changed
        blockers.clear()
        for s, q in st.queues.items():
            if q and _device(r, st, s, q, blockers):
                changed = True
    if st.pc >= len(st.prog) and not st.unresolved and not st.more:
        return None
    return blockers


def _host(st: _RankState, qd: int) -> bool:
    prog, i, h = st.prog, st.pc, st.h
    n = len(prog)
    start = i
    while i < n:
        op = prog[i]
        k = op.kind
        if k == KERNEL or k == COLL or k == WAIT:
            if k != WAIT:
                lq = st.launched.get(op.stream)
                if lq is None:
                    lq = st.launched[op.stream] = deque()
                if len(lq) >= qd:
                    old = lq[0]
                    if old.d1 < 0:
                        break
                    if old.d1 > h:
                        h = old.d1
                    lq.popleft()
                lq.append(op)
            op.h0 = h
            h += op.host
            op.h1 = h
            s = op.stream
            if k == COLL:
                op.dep = st.last_compute
            elif s == COMPUTE_STREAM:
                st.last_compute = op
            q = st.queues.get(s)
            if q is None:
                q = st.queues[s] = deque()
                st.free[s] = 0
            q.append(op)
            st.unresolved += 1
        elif k == SYNC:
            if st.unresolved:
                break
            end = max(st.free.values(), default=0)
            op.h0 = h
            op.d0 = op.d1 = end if end > h else h
            h = op.d0 + op.host
            op.h1 = h
            st.launched.clear()
        else:  # HOST, MARK, MEMORY
            op.h0 = h
            h += op.host
            op.h1 = h
        i += 1
    st.pc, st.h = i, h
    return i > start


def _device(r: int, st: _RankState, s: int, q: deque, blockers: set) -> bool:
    moved = False
    free = st.free[s]
    while q:
        op = q[0]
        k = op.kind
        if k == KERNEL:
            start = op.h1 if op.h1 > free else free
            op.d0 = start
            op.d1 = start + op.dur
        elif k == WAIT:
            c = op.coll
            if c.end is None:
                blockers.add(c)
                break
            op.d0 = op.d1 = max(op.h1, free, c.end)
        else:
            c = op.coll
            if op.d0 < 0:
                dep = op.dep
                if dep is not None and dep.d1 < 0:
                    break
                start = op.h1 if op.h1 > free else free
                if dep is not None and dep.d1 > start:
                    start = dep.d1
                op.d0 = start
                _arrive(c, r, start)
                moved = True
            if c.end is None:
                blockers.add(c)
                break
            op.d1 = c.end
        free = op.d1
        q.popleft()
        st.unresolved -= 1
        moved = True
    st.free[s] = free
    return moved


def finish_colls(programs: list[list[Op]]) -> None:
    """Copy each collective's end into its members' ops (d1)."""
    for prog in programs:
        for op in prog:
            if op.kind == COLL:
                op.d1 = op.coll.end
