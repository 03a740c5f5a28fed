"""Scale benchmark: `tracekit analyze` on simulated 5-D runs of 8 to 1,024 ranks, time and peak memory.

    python benchmarks/scale_bench.py [--ranks 8,64,256,1024] [--source sim|synth] [--events-per-rank 3000]
        [--sweep-ranks 8 --sweep-events 3000,30000,120000] [--workers 2]
        [--speedup-ranks 64] [--big-events 1000000 --big-budgets 256MB,64MB] [--data-dir DIR] [--json OUT]

Runs (each command in a fresh subprocess, `nice`d like everything on the shared box):
1. the event mix measured from the real seed trace next to the one the generator uses;
2. `tracekit analyze -j W` end to end for each rank count and for each
   events-per-rank at a fixed rank count: wall seconds, total events, µs per event, and peak memory
   as the summed PSS of the whole process tree (parent, forkserver, workers; read every 0.3 s or less often,
   paced by its own cost, `run_measured`; PSS because RSS counts shared libraries once per process, DESIGN §8),
   and the summed RSS read every 0.1 s;
3. `tracekit parse` with 1 and with W workers on the same run (parse speed-up);
4. one large single-rank trace parsed one-shot and with `--max-memory` (the chunked path);
5. the headline (`--headline-ranks`, default 1,024; `--headline-only` runs nothing else): `tracekit analyze`
   of a simulated 5-D run (HEADLINE_LAYOUTS: tp, cp and ep groups inside a host; the GPU of rank ranks//3
   slowed 1.3x, answer key with the step re-simulated without the fault) and of a real-derived
   run (copies of a real multi-rank trace, REAL_SEED, with distinct ranks and shifted clocks,
   `ensure_real_run`), each beside a plain single-process `json.load` of the same files in the same run:
   wall, CPU, peak PSS, the per-phase cost (benchmarks/scale_phases.py), whether the analysis took no longer
   than the json.load and stayed within 1.5 GB, and (simulated) whether the slow GPU is the top finding
   with its replayed saving within 10% of the answer key's (step with the fault - step without it).
6. partial tracing (`--partial-ranks`, default 0 = skipped; e.g. `--partial-ranks 10000 --partial-traced 32`):
   `tracekit simulate --trace-ranks` writes full traces on the traced ranks and collective logs on all, the GPU
   of an untraced rank (ranks//3) slowed 1.3x; `tracekit analyze` beside a plain json.load of the same files
   (the traces whole, the logs line by line) in the same run: wall, CPU, peak PSS, per-phase cost, whether it
   took under 5 minutes, and whether the slow GPU is the top finding (and its place among the stragglers)
   with the saving it names beside the answer key's (the key is read here, never by the analysis): replayed,
   the untraced rank a chain of its logged collectives in the graph (whatif/build.add_log_rank), its closed
   form (the delay it caused) beside it. Only this case runs with `--partial-only`.
With `--phases` the rank sweep also prints each rank count's per-phase cost.
The rank sweep (2) uses `tracekit simulate` (source "sim", the default): a 5-D layout per rank count
(pp x dp x cp x tp with ep 2 over dp x cp, see SIM_LAYOUTS), the tiny-moe model, the GPU of rank ranks//3 slowed 1.3x;
simulation wall/CPU seconds, peak PSS and trace events written per CPU-second are printed beside the
analysis. The events-per-rank sweep, the parse speed-up and the chunked case use the synthetic
generator (benchmarks/synth.py), which controls events per rank exactly.
Generated runs are cached in --data-dir (default /tmp/tracekit-scale).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.synth import DEFAULT_MIX, MIX_SEED_TRACE, SynthConfig, generate_run, measure_mix  # noqa: E402
from tracekit.engines.budget import child_pids  # noqa: E402

MB = 1_000_000


def _tree(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += child_pids(p)
    return seen


def _pss_kb(pid: int) -> dict[str, int]:
    vals = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"):
                    vals[key] = int(rest.split()[0])
    except OSError:
        pass
    return vals


_TICK = os.sysconf("SC_CLK_TCK")
_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
PSS_SHARE = 0.05
"""`run_measured` spends at most this share of its sampler's time reading PSS (smaps_rollup)."""


def _rss_kb(pid: int) -> int:
    """Resident memory of one process (statm: O(1), unlike smaps_rollup)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE_KB
    except (OSError, IndexError, ValueError):
        return 0


def _cpu_ticks(pid: int) -> int | None:
    """utime + stime of one process (own time only; children are sampled themselves)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def run_measured(cmd: list[str], env: dict | None = None) -> dict:
    """Run cmd; wall seconds, CPU seconds and peak summed PSS (total, anonymous) of its process tree.

    CPU is summed over every process seen (sampled every 0.1 s), so it is the cost of the work even
    when the shared box gives the (nice'd) command only part of a core; wall depends on that load.
    PSS is read at most every 0.3 s and paced by its own cost: smaps_rollup walks the page tables under the
    process's memory lock (0.19 CPU-s a read of a 5 GB process: every 0.3 s, 60% of a core taken from the
    box and page faults of the command held up), so the sampler spends at most PSS_SHARE of its time there.
    Peak summed RSS (statm, cheap) is read every 0.1 s beside it: a peak shorter than the PSS interval shows there.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    peak = {"Pss": 0, "Pss_Anon": 0, "Rss": 0}
    cpu: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:
        next_pss = 0.0
        while not done.is_set():
            pids = _tree(proc.pid)
            for p in pids:
                t = _cpu_ticks(p)
                if t is not None:
                    cpu[p] = max(cpu.get(p, 0), t)
            peak["Rss"] = max(peak["Rss"], sum(_rss_kb(p) for p in pids))
            if time.perf_counter() >= next_pss:
                c = time.thread_time()
                tot = {"Pss": 0, "Pss_Anon": 0}
                for p in pids:
                    v = _pss_kb(p)
                    for k in tot:
                        tot[k] += v.get(k, 0)
                for k in tot:
                    peak[k] = max(peak[k], tot[k])
                next_pss = time.perf_counter() + max(0.3, (time.thread_time() - c) / PSS_SHARE)
            done.wait(0.1)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, err = proc.communicate()
    done.set()
    th.join()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return {"wall_s": round(wall, 2), "cpu_s": round(sum(cpu.values()) / _TICK, 2),
            "load_avg_1m": round(os.getloadavg()[0], 1), "peak_pss_mb": round(peak["Pss"] * 1024 / MB, 1),
            "peak_pss_anon_mb": round(peak["Pss_Anon"] * 1024 / MB, 1), "peak_rss_mb": round(peak["Rss"] * 1024 / MB, 1)}


def tracekit(*args: str) -> list[str]:
    return ["nice", sys.executable, "-m", "tracekit", *args]


def analyze_phased(run: Path, out: Path, workers: int, phases: Path) -> list[str]:
    """`tracekit analyze` as the command runs it, its phases timed into `phases` (scale_phases.py)."""
    return ["nice", sys.executable, str(REPO / "benchmarks" / "scale_phases.py"), str(phases), "analyze", str(run),
            "--out", str(out), "-j", str(workers), "-q"]


JSON_LOAD = """import gzip, json, sys
for f in sys.argv[1:]:
    with (gzip.open(f, "rb") if f.endswith(".gz") else open(f, "rb")) as fh:
        if f.endswith(".jsonl"):
            doc = [json.loads(line) for line in fh]
        else:
            doc = json.load(fh)
    del doc
"""
"""The baseline: each file decompressed and `json.load`ed in turn by one plain Python process."""


def json_load_case(files: list[Path]) -> dict:
    names = [str(f) for f in files]
    if sum(map(len, names)) > 1_000_000:  # 10,000 ranks: the names through a file, not argv
        lst = Path(f"/tmp/tracekit-json-load-{os.getpid()}.txt")
        lst.write_text("\n".join(names))
        code = JSON_LOAD.replace("sys.argv[1:]", f"open({str(lst)!r}).read().split(chr(10))")
        try:
            return run_measured(["nice", sys.executable, "-c", code])
        finally:
            lst.unlink(missing_ok=True)
    return run_measured(["nice", sys.executable, "-c", JSON_LOAD, *names])


def ensure_run(data_dir: Path, ranks: int, epr: int, compress: bool = True) -> tuple[Path, dict]:
    d = data_dir / f"r{ranks}_e{epr}{'' if compress else '_plain'}"
    truth_file = d / ".ground_truth.json"
    if truth_file.is_file():
        return d, json.loads(truth_file.read_text())
    shutil.rmtree(d, ignore_errors=True)
    cfg = SynthConfig(num_ranks=ranks, events_per_rank=max(epr, 50), tp=min(8, ranks), compress=compress,
                      straggler_rank=ranks // 3 if ranks > 1 else None)
    t0 = time.perf_counter()
    truth = generate_run(cfg, d, workers=2)
    print(f"  generated {ranks} ranks x {epr} events in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return d, truth


# ranks -> (pp, dp, cp, tp); ep 2 over dp x cp; hosts of 8 GPUs
SIM_LAYOUTS = {8: (2, 1, 2, 2), 16: (2, 2, 2, 2), 32: (2, 2, 2, 4), 64: (2, 4, 2, 4), 128: (2, 8, 2, 4),
               256: (4, 8, 2, 4), 512: (4, 8, 2, 8), 1024: (4, 16, 2, 8)}


def _gz_size(path: Path) -> int:
    """Uncompressed size from the gzip trailer (files here are < 4 GiB)."""
    with open(path, "rb") as f:
        f.seek(-4, 2)
        return int.from_bytes(f.read(4), "little")


def ensure_sim_run(data_dir: Path, ranks: int) -> tuple[Path, dict]:
    """A simulated 5-D run of `ranks` GPUs with one slow GPU; the simulation itself measured."""
    d = data_dir / f"sim_r{ranks}"
    stats_file = d / "sim_stats.json"
    if stats_file.is_file():
        return d, json.loads(stats_file.read_text())
    shutil.rmtree(d, ignore_errors=True)
    pp, dp, cp, tp = SIM_LAYOUTS[ranks]
    slow = ranks // 3
    cmd = ["nice", sys.executable, "-m", "tracekit", "simulate", "--pp", str(pp), "--dp", str(dp), "--cp", str(cp),
           "--tp", str(tp), "--ep", "2", "--microbatches", str(2 * pp), "--model", "tiny-moe",
           "--fault", f"slow-gpu={slow}:1.3", "--steps", "2", "--no-without", "--out", str(d)]
    m = run_measured(cmd)
    gt = json.loads((d / ".ground_truth.json").read_text())
    files = sorted(d.glob("rank*.pt.trace.json.gz"))
    events = complete = 0
    for f in files[:: max(1, len(files) // 16)]:  # count a sample of ranks, scale up
        import gzip

        with gzip.open(f, "rt") as fh:
            doc = json.load(fh)
        events += len(doc["traceEvents"])
        complete += sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
    sampled = len(files[:: max(1, len(files) // 16)])
    events = events * len(files) // sampled
    complete = complete * len(files) // sampled
    stats = {"sim": m, "trace_events": events, "complete_events": complete,
             "json_bytes": sum(_gz_size(f) for f in files), "straggler_rank": slow,
             "layout": {"pp": pp, "dp": dp, "cp": cp, "tp": tp, "ep": 2},
             "events_per_cpu_s": round(events / max(m["cpu_s"], 1e-9)), "step_ns": gt["key"]["mean_step_ns"]}
    stats_file.write_text(json.dumps(stats))
    print(f"  simulated {ranks} ranks: {m} -> {events} events ({stats['events_per_cpu_s']} per CPU-second)",
          file=sys.stderr)
    return d, stats


SHARED = Path(os.environ.get("TRACEKIT_SHARED_TRACES") or REPO.parent / "shared" / "traces")
REAL_SEED = "hta_sampled_2rank"
"""A real multi-rank Kineto trace (2 ranks of a 128-GPU job, NCCL, ~1.8 MB of JSON per rank): the
real-derived run is copies of it."""
COPY_SHIFT_US = 1_013
"""Each copy's clock is shifted by this many µs more than the previous copy's (an integer: timestamps stay
exact)."""


def ensure_real_run(data_dir: Path, ranks: int, seed: str = REAL_SEED) -> tuple[Path, dict]:
    """`ranks` ranks made of copies of the real trace `seed`: copy c of its rank r is rank c * n + r of a
    `ranks`-GPU job (distributedInfo rank and world_size), every timestamp shifted by c * COPY_SHIFT_US."""
    import gzip

    d = data_dir / f"real_{seed}_r{ranks}"
    stats_file = d / ".real_stats.json"  # hidden, like .ground_truth.json: not an input of the analysis
    if (d / "real_stats.json").is_file():  # where earlier versions wrote it (analyze skipped it: input_skipped)
        (d / "real_stats.json").rename(stats_file)
    if stats_file.is_file():
        return d, json.loads(stats_file.read_text())
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    src = sorted(f for f in (SHARED / seed).iterdir() if f.name.endswith((".json", ".json.gz")))
    docs = []
    for f in src:
        with (gzip.open(f, "rb") if f.name.endswith(".gz") else open(f, "rb")) as fh:
            docs.append(json.load(fh))
    docs.sort(key=lambda doc: doc["distributedInfo"]["rank"])
    n = len(docs)
    t0 = time.perf_counter()
    events = complete = size = 0
    for rank in range(ranks):
        c, doc = divmod(rank, n)[0], docs[rank % n]
        shift = c * COPY_SHIFT_US
        ev = [{**e, "ts": e["ts"] + shift} if isinstance(e.get("ts"), (int, float)) else e for e in doc["traceEvents"]]
        out = {**doc, "distributedInfo": {**doc["distributedInfo"], "rank": rank, "world_size": ranks},
               "traceEvents": ev}
        text = json.dumps(out).encode()
        size += len(text)
        events += len(ev)
        complete += sum(1 for e in ev if e.get("ph") == "X")
        with gzip.open(d / f"rank{rank:05d}.pt.trace.json.gz", "wb", compresslevel=1) as fh:
            fh.write(text)
    stats = {"seed": seed, "seed_ranks": n, "trace_events": events, "complete_events": complete, "json_bytes": size}
    stats_file.write_text(json.dumps(stats))
    print(f"  wrote {ranks} real-derived ranks ({seed} x {ranks // n}) in {time.perf_counter() - t0:.1f}s",
          file=sys.stderr)
    return d, stats


HEADLINE_LAYOUTS = {64: (2, 4, 2, 4), 256: (4, 8, 2, 4), 1024: (4, 32, 2, 4), 4096: (4, 128, 2, 4)}
"""pp, dp, cp, tp of the headline's simulated cluster (ep 2 over dp x cp; hosts of 8 GPUs): the layout a user would
run, tp x cp = 8 so each tp group, cp pair and ep pair (consecutive cp ranks of one dp replica) sits inside one host,
only dp and pp cross hosts. (The sweep's SIM_LAYOUTS put tp 8 on a host, so cp and ep pairs cross hosts: genuine
placement costs that outweigh the slow GPU, which is what those findings say.)"""


def ensure_sim_keyed(data_dir: Path, ranks: int) -> tuple[Path, dict]:
    """A simulated 5-D run (HEADLINE_LAYOUTS, the GPU of rank ranks//3 slowed 1.3x) with the answer key's step
    re-simulated without the fault."""
    pp, dp, cp, tp = HEADLINE_LAYOUTS[ranks]
    d = data_dir / f"sim_r{ranks}_keyed_pp{pp}dp{dp}cp{cp}tp{tp}"
    stats_file = d / ".sim_stats.json"  # hidden, like .ground_truth.json: not an input of the analysis
    if (d / "sim_stats.json").is_file():
        (d / "sim_stats.json").rename(stats_file)
    if stats_file.is_file():
        return d, json.loads(stats_file.read_text())
    shutil.rmtree(d, ignore_errors=True)
    slow = ranks // 3
    m = run_measured(["nice", sys.executable, "-m", "tracekit", "simulate", "--pp", str(pp), "--dp", str(dp),
                      "--cp", str(cp), "--tp", str(tp), "--ep", "2", "--microbatches", str(2 * pp), "--model",
                      "tiny-moe", "--fault", f"slow-gpu={slow}:1.3", "--steps", "2", "--out", str(d)])
    gt = json.loads((d / ".ground_truth.json").read_text())
    fault = next(f for f in gt["faults"] if f["kind"] == "slow_gpu")
    files = sorted(d.glob("rank*.pt.trace.json.gz"))
    stats = {"sim": m, "json_bytes": sum(_gz_size(f) for f in files), "straggler_rank": slow,
             "layout": {"pp": pp, "dp": dp, "cp": cp, "tp": tp, "ep": 2},
             "step_ns_with": fault["step_ns_with"], "step_ns_without": fault["step_ns_without"],
             "saving_ns": fault["step_ns_with"] - fault["step_ns_without"]}
    stats_file.write_text(json.dumps(stats))
    return d, stats


PARTIAL_LAYOUTS = {64: (2, 4, 2, 4), 1024: (4, 16, 2, 8), 2048: (4, 32, 2, 8), 4096: (4, 64, 2, 8), 10_000: (5, 125, 2, 8)}
"""pp, dp, cp, tp of the partial-tracing case (ep 2 over dp x cp, tiny-moe, micro-batches 2 x pp)."""


def ensure_sim_partial(data_dir: Path, ranks: int, traced: int) -> tuple[Path, dict]:
    """A simulated run of `ranks` GPUs with full traces on `traced` of them (spread evenly) and collective logs
    on all, the GPU of rank ranks//3 (untraced) slowed 1.3x, the answer key's step re-simulated without it."""
    d = data_dir / f"sim_r{ranks}_traced{traced}"
    stats_file = d / "sim_stats.json"
    if stats_file.is_file():
        return d, json.loads(stats_file.read_text())
    pp, dp, cp, tp = PARTIAL_LAYOUTS[ranks]
    slow = ranks // 3
    m = None
    if not (d / ".ground_truth.json").is_file() or not (d / "manifest.json").is_file():
        shutil.rmtree(d, ignore_errors=True)
        m = run_measured(["nice", sys.executable, "-m", "tracekit", "simulate", "--pp", str(pp), "--dp", str(dp),
                          "--cp", str(cp), "--tp", str(tp), "--ep", "2", "--microbatches", str(2 * pp), "--model",
                          "tiny-moe", "--fault", f"slow-gpu={slow}:1.3", "--steps", "2", "--trace-ranks", str(traced),
                          "-j", "2", "--out", str(d)])
    gt = json.loads((d / ".ground_truth.json").read_text())
    fault = next(f for f in gt["faults"] if f["kind"] == "slow_gpu")
    traces = sorted(d.glob("rank*.pt.trace.json.gz"))
    logs = sorted(d.glob("comms.rank*.jsonl"))
    manifest = json.loads((d / "manifest.json").read_text())
    stats = {"sim": m, "json_bytes": sum(_gz_size(f) for f in traces) + sum(f.stat().st_size for f in logs),
             "trace_bytes": sum(_gz_size(f) for f in traces), "log_bytes": sum(f.stat().st_size for f in logs),
             "traces": len(traces), "logs": len(logs), "straggler_rank": slow,
             "straggler_traced": slow in manifest.get("traced_ranks", []),
             "layout": {"pp": pp, "dp": dp, "cp": cp, "tp": tp, "ep": 2},
             "step_ns_with": fault["step_ns_with"], "step_ns_without": fault["step_ns_without"],
             "saving_ns": fault["step_ns_with"] - fault["step_ns_without"]}
    stats_file.write_text(json.dumps(stats))
    return d, stats


def partial_case(data_dir: Path, work: Path, ranks: int, traced: int, workers: int) -> dict:
    """`tracekit analyze` of a partial recording beside a plain json.load of the same files, in the same run."""
    run, stats = ensure_sim_partial(data_dir, ranks, traced)
    files = sorted(f for f in run.iterdir() if (f.name.startswith("rank") and f.name.endswith(".json.gz"))
                   or (f.name.startswith("comms.rank") and f.name.endswith(".jsonl")))
    out, phases = work / f"partial_{ranks}_{traced}", work / f"partial_{ranks}_{traced}.phases.json"
    shutil.rmtree(out, ignore_errors=True)
    load = json_load_case(files)
    ana = run_measured(analyze_phased(run, out, workers, phases))
    analysis = json.loads((out / "analysis.json").read_text())
    inputs = analysis["sections"].get("inputs") or {}
    top = analysis["findings"][0] if analysis["findings"] else {}
    slow = [f for f in analysis["findings"] if f["kind"] == "straggler" and f.get("ranks") == [stats["straggler_rank"]]]
    named = slow[0].get("est_saving_ns") if slow else None
    row = {"source": "sim-partial", "ranks": ranks, "traced": traced, "files": len(files),
           "json_mb": round(stats["json_bytes"] / MB, 1), "trace_mb": round(stats["trace_bytes"] / MB, 1),
           "log_mb": round(stats["log_bytes"] / MB, 1), "json_load": load, "analyze": ana,
           "phases": _phase_rows(phases), "ranks_analyzed": len(analysis["ranks"]),
           "log_only_ranks": len(inputs.get("log_only_ranks") or []), "missing_ranks": len(inputs.get("missing_ranks") or []),
           "findings": len(analysis["findings"]),
           "top_findings": [{"kind": f["kind"], "ranks": (f.get("ranks") or [])[:8], "saving_ns": f.get("est_saving_ns"),
                             "replayed_saving_ns": (f.get("evidence") or {}).get("replayed_saving_ns")}
                            for f in analysis["findings"][:5]],
           "under_5_min": ana["wall_s"] < 300, "slow_rank": stats["straggler_rank"],
           "slow_rank_traced": stats["straggler_traced"], "answer_saving_ns": stats["saving_ns"],
           "slow_gpu_top": top.get("kind") == "straggler" and top.get("ranks") == [stats["straggler_rank"]],
           "slow_gpu_position": next((i for i, f in enumerate(analysis["findings"]) if f in slow), None),
           "named_saving_ns": named,
           "replayed_saving_ns": (slow[0].get("evidence") or {}).get("replayed_saving_ns") if slow else None,
           "closed_form_saving_ns": (slow[0].get("evidence") or {}).get("closed_form_saving_ns") if slow else None,
           "slow_gpu_straggler_rank": next((i for i, f in enumerate(s for s in analysis["findings"]
                                                                    if s["kind"] == "straggler") if f in slow), None),
           "saving_ratio": round(named / stats["saving_ns"], 3) if named is not None and stats["saving_ns"] else None,
           "simulate": stats["sim"]}
    shutil.rmtree(out, ignore_errors=True)
    return row


def show_partial(row: dict) -> None:
    a, j = row["analyze"], row["json_load"]
    print(f"\npartial tracing: {row['ranks']} simulated ranks, traces on {row['traced']}, logs on all "
          f"({row['files']} files, {row['json_mb']} MB JSON: traces {row['trace_mb']} MB, logs {row['log_mb']} MB):")
    print(f"  {'':<22} {'wall s':>8} {'cpu s':>8} {'peak PSS MB':>12} {'peak RSS MB':>12} {'load avg':>8}")
    for label, m in (("json.load (1 process)", j), ("tracekit analyze", a)):
        print(f"  {label:<22} {m['wall_s']:>8} {m['cpu_s']:>8} {m['peak_pss_mb']:>12} {m.get('peak_rss_mb', ''):>12} "
              f"{m['load_avg_1m']:>8}")
    print(f"  analyze/json.load: wall {a['wall_s'] / max(j['wall_s'], 1e-9):.2f}x, cpu "
          f"{a['cpu_s'] / max(j['cpu_s'], 1e-9):.2f}x; under 5 minutes: {row['under_5_min']}; ranks with a breakdown "
          f"{row['ranks_analyzed']}, log-only {row['log_only_ranks']}, missing {row['missing_ranks']}, findings {row['findings']}")
    for f in row["top_findings"]:
        print(f"    {f['kind']:<26} ranks {f['ranks']} saving {f['saving_ns']} (replayed {f['replayed_saving_ns']})")
    print(f"  slow GPU rank {row['slow_rank']} (traced: {row['slow_rank_traced']}): top finding {row['slow_gpu_top']} "
          f"(position {row['slow_gpu_position']}; among stragglers {row.get('slow_gpu_straggler_rank')}), saving "
          f"named {row['named_saving_ns']} (replayed {row.get('replayed_saving_ns')}, closed form "
          f"{row.get('closed_form_saving_ns')}) vs answer key {row['answer_saving_ns']} (ratio {row['saving_ratio']}, "
          f"within 10%: {row['saving_ratio'] is not None and abs(row['saving_ratio'] - 1) <= 0.10})")
    if row.get("simulate"):
        print(f"  simulation: {row['simulate']}")
    show_phases(row["phases"])


def _phase_rows(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {"phases": [], "total": {}}


def headline_case(data_dir: Path, work: Path, ranks: int, workers: int, source: str) -> dict:
    """`tracekit analyze` beside a plain json.load of the same files, in the same run."""
    run, stats = ensure_sim_keyed(data_dir, ranks) if source == "sim" else ensure_real_run(data_dir, ranks)
    files = sorted(f for f in run.iterdir() if f.name.startswith("rank") and f.name.endswith((".json", ".json.gz")))
    out, phases = work / f"headline_{source}_{ranks}", work / f"headline_{source}_{ranks}.phases.json"
    shutil.rmtree(out, ignore_errors=True)
    load = json_load_case(files)
    ana = run_measured(analyze_phased(run, out, workers, phases))
    analysis = json.loads((out / "analysis.json").read_text())
    row = {"source": source, "ranks": ranks, "files": len(files), "json_mb": round(stats["json_bytes"] / MB, 1),
           "json_load": load, "analyze": ana, "phases": _phase_rows(phases),
           "ranks_analyzed": len(analysis["ranks"]), "findings": len(analysis["findings"]),
           "top_findings": [{"kind": f["kind"], "ranks": (f.get("ranks") or [])[:8],
                             "saving_ns": f.get("est_saving_ns"),
                             "replayed_saving_ns": (f.get("evidence") or {}).get("replayed_saving_ns")}
                            for f in analysis["findings"][:5]],
           "no_slower_than_json_load": ana["wall_s"] <= load["wall_s"],
           "cpu_no_more_than_json_load": ana["cpu_s"] <= load["cpu_s"],
           "within_1_5_gb": ana["peak_pss_mb"] <= 1500}
    if source == "sim":
        top = analysis["findings"][0] if analysis["findings"] else {}
        slow = [f for f in analysis["findings"] if f["kind"] == "straggler" and f.get("ranks") == [stats["straggler_rank"]]]
        got = (slow[0].get("evidence") or {}).get("replayed_saving_ns") if slow else None
        row.update({"slow_rank": stats["straggler_rank"], "answer_saving_ns": stats["saving_ns"],
                    "slow_gpu_top": top.get("kind") == "straggler" and top.get("ranks") == [stats["straggler_rank"]],
                    "slow_gpu_position": next((i for i, f in enumerate(analysis["findings"]) if f in slow), None),
                    "replayed_saving_ns": got,
                    "saving_error": (round(abs(got - stats["saving_ns"]) / stats["saving_ns"], 4)
                                     if got is not None and stats["saving_ns"] else None)})
    shutil.rmtree(out, ignore_errors=True)
    return row


def show_phases(phases: dict, indent: str = "  ") -> None:
    tot = phases.get("total") or {}
    print(f"{indent}{'phase':<34} {'wall s':>8} {'cpu s':>8} {'RSS MB':>7} {'peak MB':>7}   (main process; total {tot})")
    for p in phases.get("phases", []):
        if p["wall_s"] >= 0.05:
            print(f"{indent}{p['phase']:<34} {p['wall_s']:>8} {p['cpu_s']:>8} {p.get('rss_mb', ''):>7} "
                  f"{p.get('peak_rss_mb', ''):>7}")


def show_headline(row: dict) -> None:
    a, j = row["analyze"], row["json_load"]
    print(f"\n{row['source']} {row['ranks']} ranks ({row['files']} files, {row['json_mb']} MB JSON):")
    print(f"  {'':<22} {'wall s':>8} {'cpu s':>8} {'peak PSS MB':>12} {'peak RSS MB':>12} {'load avg':>8}")
    for label, m in (("json.load (1 process)", j), (f"tracekit analyze", a)):
        print(f"  {label:<22} {m['wall_s']:>8} {m['cpu_s']:>8} {m['peak_pss_mb']:>12} {m.get('peak_rss_mb', ''):>12} "
              f"{m['load_avg_1m']:>8}")
    print(f"  analyze/json.load: wall {a['wall_s'] / max(j['wall_s'], 1e-9):.2f}x, cpu "
          f"{a['cpu_s'] / max(j['cpu_s'], 1e-9):.2f}x; no slower than json.load: {row['no_slower_than_json_load']}; "
          f"within 1.5 GB: {row['within_1_5_gb']}; ranks analyzed {row['ranks_analyzed']}, findings {row['findings']}")
    for f in row["top_findings"]:
        print(f"    {f['kind']:<26} ranks {f['ranks']} saving {f['saving_ns']} (replayed {f['replayed_saving_ns']})")
    if row["source"] == "sim":
        print(f"  slow GPU rank {row['slow_rank']}: top finding {row['slow_gpu_top']} (position "
              f"{row['slow_gpu_position']}), replayed saving {row['replayed_saving_ns']} vs answer key "
              f"{row['answer_saving_ns']} (error {row['saving_error']}; target <= 0.10)")
    show_phases(row["phases"])


def write_rate(ranks: int = 64) -> dict:
    """Trace events written per CPU-second by the simulator's writer alone (JSON text + gzip), and the
    simulation (programs + discrete-event run + key) per CPU-second of events, in this process."""
    from tracekit.simulate import ClusterSpec, Faults, ParallelLayout, ModelSpec, simulate
    from tracekit.simulate.writer import trace_bytes

    pp, dp, cp, tp = SIM_LAYOUTS[ranks]
    t0 = time.process_time()
    res = simulate(ModelSpec.preset("tiny-moe"), ClusterSpec.preset(f"{ranks // 8}x8-h100"),
                   ParallelLayout(pp=pp, dp=dp, cp=cp, tp=tp, ep=2, microbatches=2 * pp), Faults(), steps=2, without=False)
    t1 = time.process_time()
    events = 0
    for r in range(ranks):
        events += trace_bytes(res, r)[1]
    t2 = time.process_time()
    return {"ranks": ranks, "events": events, "simulate_cpu_s": round(t1 - t0, 2), "write_cpu_s": round(t2 - t1, 2),
            "events_written_per_cpu_s": round(events / (t2 - t1)),
            "events_simulated_and_written_per_cpu_s": round(events / (t2 - t0))}


def analyze_case(data_dir: Path, work: Path, ranks: int, epr: int, workers: int, source: str = "synth",
                 phases: bool = False) -> dict:
    run, truth = ensure_sim_run(data_dir, ranks) if source == "sim" else ensure_run(data_dir, ranks, epr)
    out = work / f"out_r{ranks}_e{epr}"
    shutil.rmtree(out, ignore_errors=True)
    ph = work / f"out_r{ranks}_e{epr}.phases.json"
    m = run_measured(analyze_phased(run, out, workers, ph) if phases else
                     tracekit("analyze", str(run), "--out", str(out), "-j", str(workers), "-q"))
    analysis = json.loads((out / "analysis.json").read_text())
    stragglers = [f["ranks"] for f in analysis["findings"] if f["kind"] == "straggler"]
    if source == "sim":
        epr = truth["complete_events"] // ranks
    row = {"ranks": ranks, "events_per_rank": epr, "events": truth["complete_events"],
           "json_mb": round(truth["json_bytes"] / MB, 1), "workers": workers, **m,
           "us_per_event": round(m["wall_s"] * 1e6 / truth["complete_events"], 2),
           "cpu_us_per_event": round(m["cpu_s"] * 1e6 / truth["complete_events"], 2),
           "ranks_analyzed": len(analysis["ranks"]),
           "straggler_found": [truth["straggler_rank"]] in stragglers,
           "report_mb": round((out / "report.html").stat().st_size / MB, 2) if (out / "report.html").exists() else None}
    if phases:
        row["phases"] = _phase_rows(ph)
    if source == "sim":
        row["simulate"] = {**truth["sim"], "trace_events": truth["trace_events"],
                           "events_per_cpu_s": truth["events_per_cpu_s"], "layout": truth["layout"]}
    shutil.rmtree(out, ignore_errors=True)
    return row


def parse_speedup(data_dir: Path, work: Path, ranks: int, epr: int, workers: int) -> dict:
    run, truth = ensure_run(data_dir, ranks, epr)
    res: dict[int, dict] = {}
    for w in (1, workers, 1, workers):  # alternate and keep the faster of two: the box is shared
        out = work / f"store_w{w}"
        shutil.rmtree(out, ignore_errors=True)
        m = run_measured(tracekit("parse", str(run), "--out", str(out), "-j", str(w), "-q"))
        if w not in res or m["wall_s"] < res[w]["wall_s"]:
            res[w] = m
        shutil.rmtree(out, ignore_errors=True)
    return {"ranks": ranks, "events_per_rank": epr, "json_mb": round(truth["json_bytes"] / MB, 1),
            "workers_1": res[1], f"workers_{workers}": res[workers],
            "speedup": round(res[1]["wall_s"] / res[workers]["wall_s"], 2)}


def chunked_case(data_dir: Path, work: Path, events: int, budgets: list[str]) -> dict:
    run, truth = ensure_run(data_dir, 1, events, compress=False)
    res = {}
    cases = [("one_shot", [])] + [(f"chunked_{b}", ["--max-memory", b]) for b in budgets]
    for label, extra in cases:
        out = work / f"big_{label}"
        shutil.rmtree(out, ignore_errors=True)
        res[label] = run_measured(tracekit("parse", str(run), "--out", str(out), "-q", *extra))
        shutil.rmtree(out, ignore_errors=True)
    tiny, _ = ensure_run(data_dir, 1, 100, compress=False)
    res["baseline"] = run_measured(tracekit("parse", str(tiny), "--out", str(work / "big_tiny"), "-q"))
    json_mb = truth["json_bytes"] / MB
    for label, _ in cases:
        res[label]["peak_above_baseline_mb"] = round(res[label]["peak_pss_mb"] - res["baseline"]["peak_pss_mb"], 1)
        res[label]["above_baseline_over_json"] = round(res[label]["peak_above_baseline_mb"] / json_mb, 2)
    for label in res:
        res[label]["peak_over_json"] = round(res[label]["peak_pss_mb"] / json_mb, 2)
        res[label]["mb_per_s"] = round(json_mb / res[label]["wall_s"], 1)
    return {"events": truth["complete_events"], "json_mb": round(json_mb, 1), **res}


def _spin(n: int) -> float:
    t = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return time.perf_counter() - t


def cpu_capacity(workers: int, n: int = 20_000_000) -> dict:
    """How many cores the box gives right now: a CPU-bound loop alone vs `workers` copies at once.
    On a shared machine this bounds any parallel speed-up measured in the same run."""
    from concurrent.futures import ProcessPoolExecutor

    alone = _spin(n)
    with ProcessPoolExecutor(workers) as pool:
        together = list(pool.map(_spin, [n] * workers))
    return {"spin_alone_s": round(alone, 2), "spin_together_s": [round(t, 2) for t in together],
            "effective_cores": round(workers * alone / max(together), 2)}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _fit(rows: list[dict], key: str = "wall_s") -> dict:
    """Least-squares `key` = a + b * events (b in µs per event) over the rows."""
    import numpy as np

    x = np.array([r["events"] for r in rows], float)
    y = np.array([r[key] for r in rows], float)
    if len(rows) < 2:
        return {}
    b, a = np.polyfit(x, y, 1)
    pred = a + b * x
    r2 = 1 - ((y - pred) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12)
    return {"fixed_s": round(float(a), 2), "us_per_event": round(float(b) * 1e6, 2), "r2": round(float(r2), 4)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="8,64,256,1024")
    ap.add_argument("--events-per-rank", type=int, default=3000, help="synthetic rank sweep only")
    ap.add_argument("--source", choices=("sim", "synth"), default="sim",
                    help="rank sweep on simulated 5-D runs (tracekit simulate) or on the synthetic generator")
    ap.add_argument("--sweep-ranks", type=int, default=8)
    ap.add_argument("--sweep-events", default="3000,30000,120000")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--speedup-ranks", type=int, default=64)
    ap.add_argument("--speedup-events", type=int, default=20000)
    ap.add_argument("--big-events", type=int, default=1_000_000, help="0 skips the chunked-path case")
    ap.add_argument("--big-budgets", default="256MB,64MB", help="--max-memory values for the chunked path")
    ap.add_argument("--headline-ranks", type=int, default=1024, help="0 skips the headline (analyze vs json.load)")
    ap.add_argument("--headline-sources", default="sim,real")
    ap.add_argument("--headline-only", action="store_true", help="run the headline cases only")
    ap.add_argument("--phases", action="store_true", help="per-phase cost of each rank count of the sweep")
    ap.add_argument("--partial-ranks", type=int, default=0, choices=sorted(PARTIAL_LAYOUTS) + [0],
                    help="partial tracing case: this many simulated ranks (0 skips it)")
    ap.add_argument("--partial-traced", type=int, default=32, help="partial tracing case: ranks with a full trace")
    ap.add_argument("--partial-only", action="store_true", help="run the partial tracing case only")
    ap.add_argument("--data-dir", default="/tmp/tracekit-scale")
    ap.add_argument("--json", default=None, help="write all results here")
    a = ap.parse_args(argv)
    data_dir = Path(a.data_dir)
    work = data_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": {"cpus": os.cpu_count()}}

    real = measure_mix(MIX_SEED_TRACE) if MIX_SEED_TRACE.is_file() else None
    results["mix"] = {"measured": real and vars(real), "generator": vars(DEFAULT_MIX)}
    if real:
        print(f"mix per runtime call (real {MIX_SEED_TRACE.parent.name} / generator): "
              f"cpu_op {real.cpu_op_per_runtime:.3f}/{DEFAULT_MIX.cpu_op_per_runtime:.3f}  "
              f"kernel {real.kernel_per_runtime:.3f}/{DEFAULT_MIX.kernel_per_runtime:.3f}  "
              f"memcpy {real.memcpy_per_runtime:.3f}/{DEFAULT_MIX.memcpy_per_runtime:.3f}  "
              f"memset {real.memset_per_runtime:.3f}/{DEFAULT_MIX.memset_per_runtime:.3f}  "
              f"flows/device op {real.flow_per_device_op:.2f}/{DEFAULT_MIX.flow_per_device_op:.2f}")

    def show(rows: list[dict], title: str) -> None:
        print(f"\n{title}")
        print(f"{'ranks':>6} {'ev/rank':>8} {'events':>9} {'JSON MB':>8} {'wall s':>7} {'cpu s':>7} {'cpu µs/ev':>9} "
              f"{'PSS MB':>7} {'anon MB':>7} {'analyzed':>8} {'straggler':>9} {'report MB':>9}")
        for r in rows:
            print(f"{r['ranks']:>6} {r['events_per_rank']:>8} {r['events']:>9} {r['json_mb']:>8} {r['wall_s']:>7} "
                  f"{r['cpu_s']:>7} {r['cpu_us_per_event']:>9} {r['peak_pss_mb']:>7} {r['peak_pss_anon_mb']:>7} {r['ranks_analyzed']:>8} "
                  f"{str(r['straggler_found']):>9} {str(r['report_mb']):>9}")
        print(f"fit wall = fixed + b x events: {_fit(rows)}; cpu: {_fit(rows, 'cpu_s')}")

    if a.partial_ranks:
        results["partial"] = partial_case(data_dir, work, a.partial_ranks, a.partial_traced, a.workers)
        show_partial(results["partial"])
        sys.stdout.flush()
        if a.partial_only:
            if a.json:
                Path(a.json).write_text(json.dumps(results, indent=1))
            return

    if a.headline_ranks:
        results["headline"] = []
        for src in [x for x in a.headline_sources.split(",") if x]:
            results["headline"].append(headline_case(data_dir, work, a.headline_ranks, a.workers, src))
            show_headline(results["headline"][-1])
            sys.stdout.flush()
        if a.headline_only:
            if a.json:
                Path(a.json).write_text(json.dumps(results, indent=1))
            return

    by_ranks = []
    for n in _ints(a.ranks):
        by_ranks.append(analyze_case(data_dir, work, n, a.events_per_rank, a.workers, a.source, a.phases))
        print(json.dumps(by_ranks[-1]), file=sys.stderr)
        if a.phases:
            print(f"\nper-phase cost, {n} ranks:")
            show_phases(by_ranks[-1]["phases"])
    results["by_ranks"] = {"rows": by_ranks, "fit": _fit(by_ranks), "fit_cpu": _fit(by_ranks, "cpu_s")}
    if a.source == "sim":
        show(by_ranks, f"tracekit analyze -j {a.workers} on simulated 5-D runs (tracekit simulate, 2 steps)")
        print(f"\n{'ranks':>6} {'layout pp,dp,cp,tp':>18} {'sim wall s':>10} {'sim cpu s':>9} {'sim PSS MB':>10} "
              f"{'events':>10} {'events/cpu-s':>12}")
        for r in by_ranks:
            s_ = r["simulate"]
            lay = ",".join(str(s_["layout"][k]) for k in ("pp", "dp", "cp", "tp"))
            print(f"{r['ranks']:>6} {lay:>18} {s_['wall_s']:>10} "
                  f"{s_['cpu_s']:>9} {s_['peak_pss_mb']:>10} {s_['trace_events']:>10} {s_['events_per_cpu_s']:>12}")
    else:
        show(by_ranks, f"tracekit analyze -j {a.workers}, {a.events_per_rank} complete events per rank")

    if a.source == "sim":
        results["write_rate"] = write_rate()
        print(f"\ntrace writing alone, in process (64-rank 5-D run): {results['write_rate']}")

    by_events = []
    for e in _ints(a.sweep_events):
        by_events.append(analyze_case(data_dir, work, a.sweep_ranks, e, a.workers))
        print(json.dumps(by_events[-1]), file=sys.stderr)
    results["by_events_per_rank"] = {"rows": by_events, "fit": _fit(by_events), "fit_cpu": _fit(by_events, "cpu_s")}
    show(by_events, f"tracekit analyze -j {a.workers}, {a.sweep_ranks} ranks")
    both = by_ranks + by_events
    results["fit_all"] = {"wall": _fit(both), "cpu": _fit(both, "cpu_s")}
    print(f"\nfit over both sweeps: {results['fit_all']}")

    if a.speedup_ranks:
        cap = cpu_capacity(a.workers)
        results["cpu_capacity"] = cap
        print(f"\ncores available now (a CPU loop alone vs {a.workers} at once): {cap}")
        sp = parse_speedup(data_dir, work, a.speedup_ranks, a.speedup_events, a.workers)
        results["parse_speedup"] = sp
        print(f"\ntracekit parse, {sp['ranks']} ranks x {sp['events_per_rank']} events ({sp['json_mb']} MB JSON): "
              f"1 worker {sp['workers_1']}, {a.workers} workers {sp[f'workers_{a.workers}']} "
              f"-> speed-up {sp['speedup']}x")
    if a.big_events:
        ch = chunked_case(data_dir, work, a.big_events, [b for b in a.big_budgets.split(",") if b])
        results["chunked"] = ch
        print(f"\ntracekit parse, one rank, {ch['events']} events, {ch['json_mb']} MB JSON "
              f"(baseline: a 100-event trace {ch['baseline']['peak_pss_mb']} MB):")
        for label, m in ch.items():
            if isinstance(m, dict) and label != "baseline":
                print(f"  {label:<16} wall {m['wall_s']}s cpu {m['cpu_s']}s peak PSS {m['peak_pss_mb']} MB "
                      f"(anon {m['peak_pss_anon_mb']}), above baseline {m['peak_above_baseline_mb']} MB = "
                      f"{m['above_baseline_over_json']}x JSON")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
