"""A multi-node Ray cluster on this machine, started as Ray documents it for a cluster without a
cloud launcher: `ray start --head` on the head node, then `ray start --address HEAD:PORT` once per
worker node. Each node is its own raylet with its own CPUs, its own custom resource (`node0`,
`node1`, ...), its own object store and its own ports; all of them read the same files (this
machine's disk is the shared storage the trace files and the run store live on).

    with RayCluster(nodes=3, cpus_per_node=1) as cluster:
        subprocess.run(["tracekit", "analyze", RUN, "--engine", "ray", "--address", "auto"], env=cluster.env())

Several raylets on one machine need distinct ports for everything a node listens on (Ray's
defaults are fixed numbers: node manager, object manager, metrics export, dashboard agent
HTTP/gRPC, runtime-env agent, the worker port range); every port here is picked free before the
start. The cluster gets a token of its own (token authentication, Ray's default since 2.52; the
token is in the cluster's temp dir, not ~/.ray) and the head's address goes to clients through
RAY_ADDRESS, so `--address auto` finds this cluster and no other.

Stopping never runs `ray stop` (it stops every Ray process of the machine, also other people's):
the processes this cluster started are exactly those whose command line names its temp dir
(gcs_server, raylets, monitors, agents, workers all carry the session dir), and those are
terminated, then killed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.engines.budget import child_pids

RAY = str(Path(sys.executable).with_name("ray"))

NODE_PORTS = ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
              "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port")
WORKER_PORTS = 40
"""Ports in each node's worker range (one per worker process; 1 CPU per node needs a few)."""


class ClusterStartError(RuntimeError):
    """A node did not start; the message holds `ray start`'s own error."""


def _free_ports(n: int) -> list[int]:
    """n distinct ports free now (bound to 0, read back, closed)."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _free_range(n: int, avoid: set[int]) -> int:
    """The first port of n consecutive ports that are free now and not in `avoid`."""
    for start in range(20_000 + secrets.randbelow(20_000), 60_000, n + 7):
        block = range(start, start + n)
        if avoid.intersection(block):
            continue
        ok = True
        for p in block:
            with socket.socket() as s:
                try:
                    s.bind(("", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return start
    raise ClusterStartError(f"no {n} consecutive free ports for Ray workers")


def _alive(pid: int) -> bool:
    """Running (not a zombie awaiting its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@dataclass
class RayCluster:
    nodes: int = 3
    cpus_per_node: int = 1
    object_store_bytes: int = 200 * 1000**2
    """Each node's object store (Ray's minimum is 75 MB); parse results pass through it."""
    start_timeout_s: float = 240.0
    attempts: int = 3
    """`ray start` of a node is retried: on a loaded machine a raylet can miss Ray's fixed 30 s
    registration wait ("The current node timed out during startup")."""
    temp_dir: Path = field(default=None)  # type: ignore[assignment]
    address: str = ""
    log: list[str] = field(default_factory=list)
    _ports: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if self.temp_dir is None:  # short: Ray's unix socket paths live under it (108-byte limit)
            self.temp_dir = Path(tempfile.mkdtemp(prefix="tkrc-", dir="/tmp"))
        self.temp_dir = Path(self.temp_dir)
        self.token_path = self.temp_dir / "auth_token"

    # -- environment ---------------------------------------------------------------------------
    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for `ray start` and for clients (tracekit --address auto): this cluster's
        address and token, usage stats off."""
        env = dict(os.environ if base is None else base)
        env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_path))
        env.pop("RAY_AUTH_TOKEN", None)
        if self.address:
            env["RAY_ADDRESS"] = self.address
        return env

    # -- start / stop --------------------------------------------------------------------------
    def _node_args(self, i: int) -> list[str]:
        ports = _free_ports(len(NODE_PORTS))
        self._ports.update(ports)
        lo = _free_range(WORKER_PORTS, self._ports)
        self._ports.update(range(lo, lo + WORKER_PORTS))
        args = [a for flag, p in zip(NODE_PORTS, ports) for a in (flag, str(p))]
        return [*args, "--min-worker-port", str(lo), "--max-worker-port", str(lo + WORKER_PORTS - 1),
                "--num-cpus", str(self.cpus_per_node), "--num-gpus", "0", "--resources", f'{{"node{i}": 1}}',
                "--object-store-memory", str(self.object_store_bytes), "--disable-usage-stats"]

    def _ray_start(self, i: int, args: list[str]) -> None:
        cmd = [RAY, "start", *args, *self._node_args(i)]
        last = ""
        for attempt in range(self.attempts):
            t0 = time.perf_counter()
            try:
                p = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=self.start_timeout_s)
                out, rc = p.stdout + p.stderr, p.returncode
            except subprocess.TimeoutExpired as exc:
                out, rc = f"ray start took over {self.start_timeout_s:.0f} s: {exc.stderr or ''}", -1
            self.log.append(f"node{i} attempt {attempt + 1}: rc {rc} in {time.perf_counter() - t0:.1f}s")
            if rc == 0:
                return
            last = out.strip().splitlines()[-1] if out.strip() else f"exit {rc}"
            if "timed out during startup" not in out:
                break
            if i == 0:  # a head that missed the wait may have left its GCS running: a retry must not meet it
                self._kill()
            cmd = [RAY, "start", *args, *self._node_args(i)]  # fresh ports for the retry
        raise ClusterStartError(f"`ray start` of node{i} failed: {last}")

    def start(self) -> RayCluster:
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)
        try:
            head_port, dash_port = _free_ports(2)
            self._ports.update((head_port, dash_port))
            self._ray_start(0, ["--head", "--port", str(head_port), "--temp-dir", str(self.temp_dir),
                                "--include-dashboard", "false", "--dashboard-port", str(dash_port)])
            host = self._head_host()
            self.address = f"{host}:{head_port}"
            for i in range(1, self.nodes):  # one at a time: parallel starts time out on a busy box
                self._ray_start(i, ["--address", self.address])
        except BaseException:
            self.stop()
            raise
        return self

    def _head_host(self) -> str:
        """The head's address as `ray start` wrote it (ray_current_cluster in the temp dir)."""
        f = self.temp_dir / "ray_current_cluster"
        return f.read_text().strip().rsplit(":", 1)[0] if f.is_file() else "127.0.0.1"

    def pids(self) -> list[int]:
        """Live processes of this cluster: those whose command line names its temp dir (gcs_server,
        raylets, monitors) or that hold a file under it open (the agents and workers, which rename
        themselves `ray::...` but write their logs there), and their children."""
        key = str(self.temp_dir)
        me = os.getpid()
        found: set[int] = set()
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == me or not _alive(int(d)):
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if key.encode() in f.read():
                        found.add(int(d))
                        continue
                for fd in os.listdir(f"/proc/{d}/fd"):
                    if os.readlink(f"/proc/{d}/fd/{fd}").startswith(key + "/"):
                        found.add(int(d))
                        break
            except OSError:
                pass
        todo = list(found)
        while todo:
            for c in child_pids(todo.pop()):
                if c not in found and _alive(c):
                    found.add(c)
                    todo.append(c)
        return sorted(found)

    def stop(self, grace_s: float = 3.0) -> int:
        """Terminate this cluster's processes (SIGTERM, then SIGKILL after `grace_s`) and remove its
        temp dir; the count of processes."""
        n = self._kill(grace_s)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return n

    def _kill(self, grace_s: float = 3.0) -> int:
        seen: set[int] = set()
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            pids = self.pids()
            for p in pids:
                try:
                    os.kill(p, sig)
                    seen.add(p)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self.pids():
                break
        return len(seen)

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def node_of_tasks(text: str) -> Counter:
    """{node label: tasks} from tracekit's `ray tasks by node:` line (stderr of `tracekit analyze`)."""
    import json

    for line in text.splitlines():
        if line.startswith("ray tasks by node: "):
            return Counter(json.loads(line.split(": ", 1)[1]))
    return Counter()
