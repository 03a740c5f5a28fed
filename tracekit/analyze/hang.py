"""Hangs and desyncs: where a job that stopped is stuck, and whose absence explains it (a post-mortem of
Flight Recorder dumps, or of the dumps `tracekit record --hang-timeout` leaves).

Reads `fr_entries` / `fr_status` (one row per dump entry / per pg_status group; parse/flight_recorder.py)
and `process_groups`. Definitions (docs/metrics.md, "Hangs"):

- **pending entry**: one the recorder never saw complete (state not `completed`, not retired).
- **per group G and member r**: the last collective r completed / started / enqueued in G: the highest
  sequence number of its entries in that state, or its dump's `pg_status` where the rank's own entries
  map the pg id to G (pg ids are per rank); P2P entries count apart (their own sequence numbers).
- **completed by the group**: the highest sequence number any member saw complete (a collective completes
  on no rank before every member took part; a rank whose device failed may never see its own complete), at
  most the lowest any dumped member enqueued: a "completed" past that is an abort (a rank dumping at exit
  after its peers were stopped sees its pending collective retired on "connection closed").
- **stuck collective of G**: the lowest pending collective sequence number s of any member above that.
  `entered`: members with an entry at s (or a pg_status that enqueued s); `missing`: members with a
  dump that did not; `no_dump`: members without a dump (`dead` when the recorder saw the process die).
- **mismatch**: at one sequence number of G that some member has pending, an entry whose op, dtype or
  input sizes (not for all_to_all, scatter, gather, send/recv, whose sizes differ by design) differ from
  the most common one: that rank is mismatched. (A mismatch every member completed did not stop the job.)
- **P2P**: each pending send r->p is paired with a pending recv on p from r, in order; an unpaired one
  waits for its peer (the peer is absent from it). Where both ranks' dumps hold their whole P2P history
  (their P2P sequence numbers start at 1) and the peer issued fewer sends to r than r issued recvs from
  it (or the reverse), the peer *skipped* one: `peer_skipped`.
- **root cause**: rank r waits for rank q when r has a pending entry from which q is absent (missing,
  no dump, mismatched, unpaired peer). Root causes are the ranks nothing they wait for explains (the
  sink components of that graph), ranked by how many ranks wait on them, directly or not. In a component
  where ranks wait on each other (a cycle), the ranks that skipped a send/recv are the cause.

A job is called hung when some pending entry has an absent rank, or a mismatch is seen. Section `hang`
(only when some dump holds a pending entry or a dead rank; dumps whose calls all finished, e.g. the ones
`tracekit record` takes at the end of its window, say nothing about a hang): {"hung", "dumps": {"ranks", "empty", "no_dump", "dead"}, "groups": [{"pg_name",
"pg_desc", "ranks", "stuck": {...} | null, "members": [...], "mismatches": [...]}], "p2p_unmatched": [...],
"waits": [{"rank", "waits_for"}], "root_causes": [{"ranks", "kind", "blocked_ranks", "collective",
"frames"}]}. Finding `hang` (critical, first of all findings) names the root-cause ranks, their kind
(missing / mismatch / dead / no_dump) and the stuck collective (group id, description, op, sizes, dtype).
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from tracekit.findings.evidence import Evidence
from tracekit.findings.finding import Finding, FindingKind, Severity
from tracekit.findings.result import AnalyzerResult
from tracekit.tables.store import RunStore

SIZE_FREE_OPS = frozenset({"all_to_all", "send", "recv", "scatter", "gather", "unknown"})
"""Ops whose sizes may differ across ranks by design (uneven all_to_all splits, P2P pairs, the root's
list of a scatter or gather)."""
_SHOWN = 64


@dataclass(frozen=True)
class HangResult(AnalyzerResult):
    hung: bool = False


def analyze_hang(store: RunStore) -> HangResult:
    if not store.has("fr_status"):
        return HangResult()
    status = store.table("fr_status").to_pylist()
    if not status:
        return HangResult()
    entries = sorted(store.table("fr_entries").to_pylist(), key=lambda e: (e["rank"], e["record_id"] or 0,
                                                                          e["enqueue_ts"] or 0))
    dumps = _dumps(status)
    if not any(_pending(e) for e in entries) and not dumps["dead"]:
        return HangResult()  # every recorded call finished (e.g. a dump taken at the end of a profiled window)
    groups = _groups(store, entries)
    members = {r for g in groups.values() for r in g["ranks"] or ()}
    dumps["no_dump"] = sorted(members - set(dumps["ranks"]))
    progress = _progress(entries, status)
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        by_group[e["pg_name"]].append(e)
    per_group = [_group_state(name, g, by_group.get(name, []), progress, dumps) for name, g in sorted(groups.items())]
    p2p = _p2p_unmatched(entries)
    waits = _waits(per_group, p2p)
    roots = _root_causes(waits, per_group, dumps, entries, p2p)
    hung = bool(waits) or any(g["mismatches"] for g in per_group)
    section = {"hung": hung, "dumps": dumps, "groups": per_group, "p2p_unmatched": p2p[:_SHOWN],
               "last_entered": _last_entered(entries, dumps),
               "waits": [{"rank": r, "waits_for": sorted(w)} for r, w in sorted(waits.items())],
               "root_causes": roots}
    findings = [_finding(roots[0], per_group, len(waits))] if hung and roots else []
    return HangResult(findings=findings, section=section, hung=hung)


def _dumps(status: list[dict[str, Any]]) -> dict[str, Any]:
    ranks = sorted({s["rank"] for s in status})
    empty = sorted({s["rank"] for s in status if not s["num_entries"]})
    dead = sorted({s["rank"] for s in status if s["dead"]})
    return {"ranks": ranks, "empty": empty, "dead": dead, "no_dump": [],
            "files": {str(s["rank"]): s["source_file"] for s in status}}


def _last_entered(entries: list[dict[str, Any]], dumps: dict[str, Any]) -> list[dict[str, Any]]:
    """Per rank with a dump, the last collective or send/recv it entered (latest enqueue time; on the rank's
    trace clock when a Kineto trace of it was parsed, else wall clock ns) — the timeline of where each stopped."""
    last: dict[int, dict[str, Any]] = {}
    for e in entries:
        if e["enqueue_ts"] is not None and (e["rank"] not in last or e["enqueue_ts"] >= last[e["rank"]]["enqueue_ts"]):
            last[e["rank"]] = e
    return [{"rank": r, "pg_name": last[r]["pg_name"], "pg_desc": last[r]["pg_desc"], "enqueue_ts": last[r]["enqueue_ts"],
             **_collective(last[r])} if r in last else {"rank": r, "op": None, "enqueue_ts": None}
            for r in dumps["ranks"]]


def _groups(store: RunStore, entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """pg_name -> {desc, ranks}: the merged process_groups, plus groups only entries name."""
    out: dict[str, dict[str, Any]] = {}
    for g in store.table("process_groups", columns=["pg_name", "pg_desc", "ranks"]).to_pylist():
        if g["ranks"]:
            out.setdefault(g["pg_name"], {"desc": g["pg_desc"], "ranks": sorted(g["ranks"])})
    for e in entries:
        if e["pg_name"] is not None and e["pg_name"] not in out:
            out[e["pg_name"]] = {"desc": e["pg_desc"], "ranks": None}
    return out


def _pending(e: dict[str, Any]) -> bool:
    return e["state"] != "completed" and not e["retired"]


def _progress(entries: list[dict[str, Any]], status: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, int]]:
    """(rank, pg_name) -> last enqueued / started / completed collective seq, from entries and pg_status."""
    out: dict[tuple[int, str], dict[str, int]] = defaultdict(lambda: {"enqueued": -1, "started": -1, "completed": -1})
    p2p_ids = {(e["rank"], e["pg_id"]) for e in entries if e["is_p2p"]}
    p2p_names = {(e["rank"], e["pg_name"]) for e in entries if e["is_p2p"]}
    for e in entries:
        if e["is_p2p"] or e["pg_name"] is None or e["seq"] is None:
            continue
        p = out[(e["rank"], e["pg_name"])]
        p["enqueued"] = max(p["enqueued"], e["seq"])
        if e["state"] in ("started", "completed") or e["retired"]:
            p["started"] = max(p["started"], e["seq"])
        if not _pending(e):
            p["completed"] = max(p["completed"], e["seq"])
    for s in status:  # pg_status counts P2P ops too where the group has them: used only where it has none
        if s["pg_name"] is None or (s["rank"], s["pg_id"]) in p2p_ids or (s["rank"], s["pg_name"]) in p2p_names:
            continue
        p = out[(s["rank"], s["pg_name"])]
        for k in ("enqueued", "started", "completed"):
            if s[f"last_{k}"] is not None:
                p[k] = max(p[k], s[f"last_{k}"])
    return out


def _signature(e: dict[str, Any]) -> tuple[Any, ...]:
    sizes = None if e["op"] in SIZE_FREE_OPS else e["in_sizes"]
    return (e["op"], e["dtype"], sizes)


def _mismatches(name: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every sequence number of group `name` where members' entries differ (op, dtype, sizes)."""
    by_seq: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        if e["pg_name"] == name and not e["is_p2p"] and e["seq"] is not None:
            by_seq[e["seq"]].append(e)
    out = []
    for seq, es in sorted(by_seq.items()):
        counts = Counter(_signature(e) for e in es)
        if len(counts) < 2 or not any(_pending(e) for e in es):
            continue
        common = max(counts, key=lambda k: (counts[k], -min(e["rank"] for e in es if _signature(e) == k)))
        odd = [e for e in es if _signature(e) != common]
        out.append({"seq": seq, "expected": _collective(next(e for e in es if _signature(e) == common)),
                    "ranks": sorted({e["rank"] for e in odd}),
                    "entries": [{"rank": e["rank"], **_collective(e)} for e in odd[:_SHOWN]]})
    return out


def _collective(e: dict[str, Any]) -> dict[str, Any]:
    return {"op": e["op"], "name": e["name"], "seq": e["seq"], "in_sizes": e["in_sizes"],
            "out_sizes": e["out_sizes"], "dtype": e["dtype"], "state": e["state"]}


def _group_state(name: str, g: dict[str, Any], mine: list[dict[str, Any]],
                 progress: dict[tuple[int, str], dict[str, int]], dumps: dict[str, Any]) -> dict[str, Any]:
    """The group's stuck collective, its members' progress and its mismatches (`mine`: its entries)."""
    ranks = g["ranks"] or sorted({e["rank"] for e in mine})
    have = set(dumps["ranks"])
    members = [{"rank": r, **({"last_" + k: v for k, v in progress[(r, name)].items()}
                            if (r, name) in progress else {"last_enqueued": None, "last_started": None,
                                                            "last_completed": None})} for r in ranks if r in have]
    # a collective completes only once every member entered it: a member's "completed" past what another
    # dumped member ever enqueued is an abort (a rank's dump written at exit after its peers were stopped,
    # its pending collective retired on "connection closed"), not the group's progress
    done = min(max((progress[(r, name)]["completed"] for r in ranks if (r, name) in progress), default=-1),
               min((progress[(r, name)]["enqueued"] for r in ranks if r in have and (r, name) in progress),
                   default=sys.maxsize))
    pending = [e for e in mine if _pending(e) and not e["is_p2p"] and e["seq"] is not None and e["seq"] > done]
    stuck = None
    if pending:
        s = min(e["seq"] for e in pending)
        at = [e for e in mine if e["seq"] == s and not e["is_p2p"]]
        entered = sorted({e["rank"] for e in at} | {r for r in ranks if r in have and (r, name) in progress
                                                     and progress[(r, name)]["enqueued"] >= s})
        first = min((e for e in at if _pending(e)), key=lambda e: (e["enqueue_ts"] or 0, e["rank"]))
        stuck = {**_collective(first), "first_enqueue_ts": first["enqueue_ts"], "entered": entered,
                 "missing": [r for r in ranks if r in have and r not in entered],
                 "no_dump": [r for r in ranks if r not in have],
                 "waiting": sorted({e["rank"] for e in at if _pending(e)})}
    return {"pg_name": name, "pg_desc": g["desc"], "ranks": ranks, "completed_by_group": done, "stuck": stuck,
            "members": members,
            "mismatches": _mismatches(name, mine)}


def _p2p_unmatched(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pending sends and recvs with no pending counterpart on the peer (paired in order per direction)."""
    sends: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        if e["is_p2p"] and _pending(e) and e["peer"] is not None:
            if e["op"] == "send":
                sends[(e["rank"], e["peer"])].append(e)
            elif e["op"] == "recv":
                recvs[(e["peer"], e["rank"])].append(e)
    issued, complete = _p2p_history(entries)
    out = []
    for key in sorted(set(sends) | set(recvs)):
        s, r = sends.get(key, []), recvs.get(key, [])
        extra = s[len(r):] if len(s) > len(r) else r[len(s):]
        n_send, n_recv = issued.get(("send",) + key, 0), issued.get(("recv",) + key, 0)
        for e in extra:
            known = key[0] in complete and key[1] in complete
            skipped = known and (n_send < n_recv if e["op"] == "recv" else n_recv < n_send)
            out.append({"waiting_rank": e["rank"], "peer": e["peer"], "src": key[0], "dst": key[1],
                        "pg_name": e["pg_name"], "pg_desc": e["pg_desc"], "peer_skipped": skipped,
                        "sends_issued": n_send if known else None, "recvs_issued": n_recv if known else None,
                        **_collective(e)})
    return out


def _p2p_history(entries: list[dict[str, Any]]) -> tuple[Counter, set[int]]:
    """Sends / recvs each rank issued per (src, dst), and the ranks whose dumps hold every P2P call
    they made (in each group, P2P sequence numbers from 1 without a gap)."""
    issued: Counter = Counter()
    seqs: dict[tuple[int, str], list[int]] = defaultdict(list)
    for e in entries:
        if not e["is_p2p"] or e["peer"] is None or e["op"] not in ("send", "recv"):
            continue
        key = (e["rank"], e["peer"]) if e["op"] == "send" else (e["peer"], e["rank"])
        issued[(e["op"],) + key] += 1
        if e["seq"] is not None:
            seqs[(e["rank"], e["pg_name"])].append(e["seq"])
    whole: dict[int, bool] = {}
    for (rank, _), ss in seqs.items():
        ok = sorted(ss) == list(range(1, len(ss) + 1))
        whole[rank] = whole.get(rank, True) and ok
    return issued, {r for r, ok in whole.items() if ok}


def _waits(groups: list[dict[str, Any]], p2p: list[dict[str, Any]]) -> dict[int, set[int]]:
    """rank -> the ranks absent from something it waits in."""
    waits: dict[int, set[int]] = defaultdict(set)
    for g in groups:
        st = g["stuck"]
        odd = {r for m in g["mismatches"] for r in m["ranks"]}
        if st is not None:
            absent = set(st["missing"]) | set(st["no_dump"]) | (odd & set(st["entered"]))
            for r in st["waiting"]:
                waits[r] |= absent - {r}
        for m in g["mismatches"]:
            for r in set(g["ranks"]) - set(m["ranks"]):
                waits[r] |= set(m["ranks"])
    for u in p2p:
        waits[u["waiting_rank"]].add(u["peer"])
    return {r: w for r, w in waits.items() if w}


def _reach(waits: dict[int, set[int]], start: int) -> set[int]:
    seen, todo = set(), [start]
    while todo:
        for q in waits.get(todo.pop(), ()):
            if q not in seen:
                seen.add(q)
                todo.append(q)
    return seen


def _skippers_first(comps: dict[frozenset[int], set[int]], p2p: list[dict[str, Any]]
                    ) -> dict[frozenset[int], set[int]]:
    """In a component of ranks waiting on each other, the ones that skipped a send/recv are the cause;
    the others wait on them."""
    skipped = {u["peer"] for u in p2p if u.get("peer_skipped")}
    out = {}
    for comp, blocked in comps.items():
        cause = comp & skipped
        if cause and cause != comp:
            out[frozenset(cause)] = blocked | (comp - cause)
        else:
            out[comp] = blocked
    return out


def _root_causes(waits: dict[int, set[int]], groups: list[dict[str, Any]], dumps: dict[str, Any],
                 entries: list[dict[str, Any]], p2p: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sink components of the wait graph, most-waited-on first."""
    nodes = set(waits) | {q for w in waits.values() for q in w}
    reach = {n: _reach(waits, n) for n in nodes}
    sinks = [n for n in nodes if all(n in reach[q] for q in reach[n])]
    comps: dict[frozenset[int], set[int]] = {}
    for n in sinks:
        comp = frozenset({n} | {q for q in reach[n] if n in reach[q]})
        comps[comp] = {r for r in nodes if comp & (reach[r] | {r})} - comp
    comps = _merge_co_absent(comps, groups)
    comps = _skippers_first(comps, p2p)
    ranked = sorted(comps.items(), key=lambda kv: (-len(kv[1]), min(kv[0])))
    return [_root(sorted(c), sorted(blocked), groups, dumps, entries, p2p) for c, blocked in ranked[:_SHOWN]]


def _merge_co_absent(comps: dict[frozenset[int], set[int]], groups: list[dict[str, Any]]
                     ) -> dict[frozenset[int], set[int]]:
    """Root components absent from one stuck collective together are one cause (e.g. two ranks that both
    never entered an all_to_all): merged, with the union of the ranks they block."""
    absent_sets = [set(g["stuck"]["missing"]) | set(g["stuck"]["no_dump"]) for g in groups if g["stuck"]]
    absent_sets += [set(m["ranks"]) for g in groups for m in g["mismatches"]]
    merged = [(set(c), set(b)) for c, b in comps.items()]
    changed = True
    while changed:
        changed = False
        for i in range(len(merged)):
            for j in range(i + 1, len(merged)):
                if any(s & merged[i][0] and s & merged[j][0] for s in absent_sets):
                    merged[i] = (merged[i][0] | merged[j][0], merged[i][1] | merged[j][1])
                    del merged[j]
                    changed = True
                    break
            if changed:
                break
    return {frozenset(c): b - c for c, b in merged}


def _kind(ranks: list[int], groups: list[dict[str, Any]], dumps: dict[str, Any]) -> str:
    odd = {r for g in groups for m in g["mismatches"] for r in m["ranks"]}
    if any(r in odd for r in ranks):  # a mismatched call explains the hang even when the rank then died of it
        return "mismatch"
    if any(r in dumps["dead"] for r in ranks):
        return "dead"
    if all(r not in dumps["ranks"] for r in ranks):
        return "no_dump"
    return "missing"


def _headline(ranks: list[int], groups: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The stuck collective that most of `ranks` are absent from (most members waiting, earliest first)."""
    best, key = None, None
    for g in groups:
        for m in g["mismatches"]:
            hit = len(set(ranks) & set(m["ranks"]))
            k = (hit, 1, len(g["ranks"]), -m["seq"])  # a mismatch explains more than an absence
            if hit and (key is None or k > key):
                best, key = {"pg_name": g["pg_name"], "pg_desc": g["pg_desc"], "ranks": g["ranks"], **m["expected"],
                             "mismatched": m["entries"]}, k
        st = g["stuck"]
        if st is None:
            continue
        hit = len(set(ranks) & (set(st["missing"]) | set(st["no_dump"])))
        k = (hit, 0, len(st["waiting"]), -(st["first_enqueue_ts"] or 0))
        if hit and (key is None or k > key):
            best, key = {"pg_name": g["pg_name"], "pg_desc": g["pg_desc"], "ranks": g["ranks"], **st}, k
    return best


def _p2p_headline(ranks: list[int], p2p: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The unpaired send/recv that waits on `ranks` (one the peer skipped first)."""
    hits = [u for u in p2p if u["peer"] in ranks]
    if not hits:
        return None
    u = max(hits, key=lambda u: (u["peer_skipped"], -(u["seq"] or 0)))
    return {**u, "missing": [u["peer"]], "no_dump": [], "entered": [u["waiting_rank"]]}


def _root(ranks: list[int], blocked: list[int], groups: list[dict[str, Any]], dumps: dict[str, Any],
          entries: list[dict[str, Any]], p2p: list[dict[str, Any]]) -> dict[str, Any]:
    last: dict[int, dict[str, Any]] = {}
    for e in entries:  # entries are in issue order per rank: the last one wins
        if e["rank"] in ranks:
            last[e["rank"]] = e
    return {"ranks": ranks, "kind": _kind(ranks, groups, dumps), "blocked_ranks": blocked,
            "collective": _headline(ranks, groups) or _p2p_headline(ranks, p2p),
            "last_entries": {str(r): _collective(e) for r, e in last.items()},
            "frames": {str(r): e["frames"] for r, e in last.items() if e.get("frames")}}


_KIND_TEXT = {"missing": "never entered it", "dead": "died (no process left to enter it)",
              "mismatch": "entered it with a different op, size or dtype", "no_dump": "left no dump (never entered it)"}


def _finding(root: dict[str, Any], groups: list[dict[str, Any]], num_waiting: int) -> Finding:
    c = root["collective"] or {}
    ranks = root["ranks"]
    where = (f"group {c.get('pg_name')} ({c.get('pg_desc') or 'no description'}) is stuck at {c.get('op')} "
             f"#{c.get('seq')} ({c.get('in_sizes') or '?'}, {c.get('dtype') or '?'})") if c else "the job is stuck"
    if c.get("waiting_rank") is not None:  # an unpaired send/recv
        where = (f"rank {c['waiting_rank']} waits in {c.get('op')} #{c.get('seq')} {'to' if c.get('op') == 'send' else 'from'} "
                 f"rank {c['peer']} (group {c.get('pg_name')}, {c.get('in_sizes') or '?'}, {c.get('dtype') or '?'})")
    who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    what = _KIND_TEXT[root["kind"]]
    if c.get("waiting_rank") is not None and root["kind"] == "missing":
        what = f"never posted the matching {'recv' if c.get('op') == 'send' else 'send'}"
    summary = (f"job hung: {where}: {who} {what}; {len(root['blocked_ranks'])} rank(s) "
               f"wait on {'them' if len(ranks) > 1 else 'it'}")
    rec = {"missing": f"look at what {who} did instead (their last entries and stacks are in the hang section); "
                      "a data-dependent branch, a lock or a device error keeps a rank from the collective",
           "dead": f"read the log of {who}: the process exited before the collective",
           "mismatch": f"{who} called the collective with other arguments: check shapes and dtypes at that call",
           "no_dump": f"{who} wrote no dump: find out whether the process was alive (a held GIL or a crash)"}
    details = {"hang_kind": root["kind"], "root_ranks": ranks, "blocked_ranks": root["blocked_ranks"][:_SHOWN],
               "collective": {k: c.get(k) for k in ("pg_name", "pg_desc", "op", "name", "seq", "in_sizes",
                                                    "out_sizes", "dtype", "missing", "no_dump", "entered",
                                                    "waiting_rank", "peer", "peer_skipped")
                              if k in c},
               "ranks_waiting": num_waiting}
    if root["kind"] == "mismatch" and c.get("mismatched"):
        details["mismatched"] = c["mismatched"]
    return Finding(kind=FindingKind.HANG, severity=Severity.CRITICAL, summary=summary, ranks=tuple(ranks),
                   evidence=Evidence(details=details), recommendation=rec[root["kind"]])
