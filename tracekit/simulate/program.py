"""The workload: per rank, the ordered host ops of each training step for a model, layout and faults.

Costs: GEMMs at peak × efficiency, memory-bound kernels at HBM bandwidth, a small seeded jitter per
kernel; collectives sized from the activations / parameters they move (see executor.py for timing).
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from tracekit.collectives import bus_factor
from tracekit.layout import ParallelLayout
from tracekit.simulate.executor import COLL, COMPUTE_STREAM, HOST, KERNEL, MARK, MEMORY, SYNC, WAIT, Coll, Op
from tracekit.simulate.specs import ClusterSpec, Faults, ModelSpec, ring_hops, validate_layout
from tracekit.simulate.topology import Group, Topology, build_topology

US = 1000
STREAMS = {"tp": 13, "cp": 15, "dp": 19, "dp_cp": 19, "fsdp": 21, "ep": 23, "edp": 25, "pp": 27, "world": 29}
P2P_STREAMS = {("cp", "send", "next"): 41, ("cp", "recv", "prev"): 43}
RPC_NAME = {"all_reduce": "allreduce", "all_gather": "_allgather_base", "reduce_scatter": "_reduce_scatter_base",
            "all_to_all": "all_to_allv", "send": "send", "recv": "recv", "broadcast": "broadcast"}
DTYPE_NAME = {2: "BFloat16", 4: "Float", 1: "Float8_e4m3fn"}
DTYPE_SHORT = {"BFloat16": "bf16", "Float": "f32", "Float8_e4m3fn": "f8e4m3"}

K_GEMM = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN"
K_GEMM_BW = "nvjet_tst_192x192_64x3_2x1_v_bz_coopB_TNT"
K_NORM = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
          "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)")
K_NORM_BW = ("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>"
             "(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, c10::BFloat16*, int)")
K_FLASH = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
           "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>"
           "(pytorch_flash::Flash_fwd_params)")
K_FLASH_BW = ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, "
              "false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, false, true, "
              "false, false, true, true, false>(pytorch_flash::Flash_bwd_params)")
K_ACT = ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(at::TensorIteratorBase&)::"
         "{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, "
         "std::array<char*, 2ul> >(int, at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::"
         "{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)")
K_EMBED = ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>"
           "(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16 const, "
           "unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)")
K_SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, float, "
             "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, c10::BFloat16 const*, int)")
K_TOPK = ("void at::native::sbtopk::gatherTopK<c10::BFloat16, unsigned int, 2, false>(at::cuda::detail::TensorInfo"
          "<c10::BFloat16 const, unsigned int>, unsigned int, unsigned int, bool, unsigned int, unsigned int, "
          "at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, unsigned int, at::cuda::detail::TensorInfo<long, "
          "unsigned int>, unsigned int, c10::BFloat16*)")
K_ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
          "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
          "(at::native::ADAM_MODE)1, false>, double, double, double, double, double, double, bool, float*, float*>"
          "(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
          "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double, double, double, double, double, "
          "double, bool, float*, float*)")
MEMCPY_H2D = "Memcpy HtoD (Pinned -> Device)"
MEMCPY_D2H = "Memcpy DtoH (Device -> Pinned)"
DATA_LOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


@lru_cache(maxsize=None)
def nccl_kernel(op: str, dtype: str) -> str:
    """(cached: one string object per kernel name, not one per collective op)"""
    short = DTYPE_SHORT.get(dtype, "bf16")
    base = {"all_reduce": f"AllReduce_Sum_{short}_RING_LL", "all_gather": "AllGather_RING_LL",
            "reduce_scatter": f"ReduceScatter_Sum_{short}_RING_LL", "broadcast": "Broadcast_RING_LL"}.get(op, "SendRecv")
    return f"ncclDevKernel_{base}(ncclDevComm*, unsigned long, ncclWork*)"


@dataclass
class World:
    """Everything shared while building and timing one simulation."""

    model: ModelSpec
    cluster: ClusterSpec
    layout: ParallelLayout
    faults: Faults
    seed: int
    topo: Topology
    colls: dict = field(default_factory=dict)
    stages: tuple = ()
    routing: dict = field(default_factory=dict)  # (step, layer, mb, ep_group_name) -> counts[rank_in_group][expert]
    full_size: dict = field(default_factory=dict)
    """dim -> group size at full scale, when fewer data-parallel replicas stand for all of them
    (tracekit.advise.predict: replicas are symmetric, so one or two show the step of all)."""
    full_inter: dict = field(default_factory=dict)
    """dim -> whether that dim's groups span hosts at full scale (same use as `full_size`)."""

    def link(self, g: Group, op: str | None = None) -> tuple[int, float]:
        """(latency ns, ns per bus byte) of the tier the group spans (or of `op` on it, where the cluster
        lists measured per-op costs), with slow-link / slow-NIC faults."""
        c = self.cluster
        inter = self.full_inter.get(g.dim, g.hosts > 1)
        lat = (c.inter_lat_us if inter else c.intra_lat_us) * US
        bw = c.inter_bw_gbs if inter else c.intra_bw_gbs
        tier = "inter" if inter else "intra"
        for t, o, lat_us, bw_gbs in c.coll_costs:
            if (t, o) == (tier, op):
                hops = ring_hops(o, self.full_size.get(g.dim, len(g.ranks))) if c.coll_lat_per_hop else 1
                lat, bw = lat_us * US * hops, bw_gbs
        dim = "dp" if g.dim == "dp_cp" else g.dim
        bw /= self.faults.slow_link.get(dim, 1.0)
        if inter and self.faults.slow_nic:
            hosts = {self.topo.host[r] for r in g.ranks}
            bw /= max([f for h, f in self.faults.slow_nic.items() if h in hosts], default=1.0)
        return int(lat), 1.0 / bw

    def coll(self, key, op: str, g: Group, members: tuple[int, ...], seq=None) -> Coll:
        c = self.colls.get(key)
        if c is None:
            lat, nspb = self.link(g if len(members) == len(g.ranks) else _pair(self.topo, g, members), op)
            c = Coll(key, op, g, members, lat, nspb, seq)
            self.colls[key] = c
        return c


def _pair(topo: Topology, g: Group, members) -> Group:
    return Group(g.name, g.desc, g.dim, tuple(members), len({topo.host[r] for r in members}))


class Rank:
    """Builds one rank's program."""

    def __init__(self, w: World, rank: int):
        self.w = w
        self.r = rank
        self.ops: list[Op] = []
        self.seq: dict[str, int] = {}
        self.rng = random.Random(w.seed * 1_000_003 + rank)
        self.slow = w.faults.slow_gpu.get(rank, 1.0)
        c = w.cluster
        self.flops_per_ns = c.peak_tflops * 1e3 * c.efficiency
        self.hbm = c.hbm_gbs
        self.op_ns = int((c.op_us + c.launch_us) * US)
        self.step = 0
        self.pp_i, self.dp_i, self.cp_i, self.tp_i = w.topo.coords(rank)
        self.mem = 0

    # ---- primitives ------------------------------------------------------------------------------
    def _jit(self) -> float:
        return 1.0 + max(-0.05, min(0.05, self.rng.gauss(0.0, 0.015)))

    def gemm(self, name: str, flops: float, kname: str = K_GEMM) -> None:
        ns = max(2500.0, flops / self.flops_per_ns) * self.slow * self._jit()
        # a backward GEMM runs inside its autograd node, as PyTorch's profiler shows it
        # (`autograd::engine::evaluate_function: MmBackward0` around `aten::mm`): the writer nests it there
        node = "MmBackward0" if kname == K_GEMM_BW else None
        self.ops.append(Op(KERNEL, name, kname, COMPUTE_STREAM, int(ns), self.op_ns, step=self.step, extra=node))

    def memk(self, name: str, nbytes: float, kname: str) -> None:
        ns = max(1800.0, nbytes / self.hbm) * self.slow * self._jit()
        self.ops.append(Op(KERNEL, name, kname, COMPUTE_STREAM, int(ns), self.op_ns, step=self.step))

    def memcpy(self, name: str, kname: str, nbytes: float) -> None:
        ns = max(1500.0, nbytes / 25.0)  # PCIe-class copy
        self.ops.append(Op(KERNEL, name, kname, COMPUTE_STREAM, int(ns), self.op_ns, cat="gpu_memcpy",
                           step=self.step, extra=int(nbytes)))

    def host(self, name: str, ns: float, cat: str = "user_annotation") -> None:
        self.ops.append(Op(HOST, name, host=int(ns), cat=cat, step=self.step))

    def mark(self, name: str, begin: bool, cat: str = "user_annotation") -> None:
        self.ops.append(Op(MARK, name, cat=cat, step=self.step, extra=begin))

    def memory(self, delta: int) -> None:
        self.mem += delta
        self.ops.append(Op(MEMORY, "[memory]", step=self.step, extra=(delta, self.mem)))

    def collective(self, op: str, dim: str, nbytes_in: int, nbytes_out: int, dtype_b: int = 2,
                   splits: tuple[list[int], list[int]] | None = None, bus_bytes: float | None = None,
                   wait: bool = True, stream: int | None = None) -> Coll | None:
        g = self.w.topo.group(self.r, dim)
        if g is None:
            return None
        s = self.seq.get(g.name, 0) + 1
        self.seq[g.name] = s
        c = self.w.coll((g.name, s), op, g, g.ranks, seq=s)
        n = self.w.full_size.get(g.dim, g.size)
        dtype = DTYPE_NAME.get(dtype_b, "BFloat16")
        c.dtype = dtype
        c.nelems[self.r] = (nbytes_in // dtype_b, nbytes_out // dtype_b)
        if splits is not None:
            c.splits[self.r] = splits
        bb = bus_bytes if bus_bytes is not None else max(nbytes_in, nbytes_out) * bus_factor(op, n)
        if bb > c.bytes:
            c.bytes = bb
        st = stream if stream is not None else STREAMS[dim]
        self.ops.append(Op(COLL, "record_param_comms", nccl_kernel(op, dtype), st, host=self.op_ns + 8 * US,
                           coll=c, cat="kernel", step=self.step))
        if wait:
            self.wait(c)
        return c

    def wait(self, c: Coll | None, stream: int = COMPUTE_STREAM) -> None:
        if c is not None:
            self.ops.append(Op(WAIT, "cudaStreamWaitEvent", stream=stream, host=1 * US, coll=c, step=self.step))

    def p2p(self, key, op: str, dim: str, peer: int, nbytes: int, stream: int) -> Coll:
        g = self.w.topo.group(self.r, dim)
        src, dst = (self.r, peer) if op == "send" else (peer, self.r)
        c = self.w.coll(key, "sendrecv", g, (src, dst))
        c.nelems[self.r] = (nbytes // 2, nbytes // 2)
        if nbytes > c.bytes:
            c.bytes = nbytes
        self.ops.append(Op(COLL, "record_param_comms", nccl_kernel("send", "BFloat16"), stream,
                           host=self.op_ns + 6 * US, coll=c, step=self.step, peer=(op, peer)))
        return c

    def sync(self, name: str = "aten::item") -> None:
        self.memcpy("aten::_local_scalar_dense", MEMCPY_D2H, 4)
        self.ops.append(Op(SYNC, name, host=3 * US, step=self.step))


# ---- the model's work per micro-batch ---------------------------------------------------------------

def tokens(w: World, rk: Rank) -> int:
    """Tokens per micro-batch on this rank (sequence sharded over cp; uneven-seq fault on one dp replica)."""
    m = w.model
    t = m.micro_batch_size * m.seq // w.layout.cp
    us = w.faults.uneven_seq
    if us is not None and rk.dp_i == us[0]:
        t = int(t * us[1])
    return t


def layer_fwd(w: World, rk: Rank, layer: int, mb: int, T: int, recompute: bool = False) -> None:
    m, L = w.model, w.layout
    h, tp, db = m.hidden, L.tp, m.dtype_bytes
    d = h // m.heads
    sp = T // tp if tp > 1 and L.sequence_parallel else T
    act = T * h * db
    if L.fsdp and not recompute:
        fsdp_gather(w, rk, layer)
    rk.memk("aten::native_layer_norm", 2 * sp * h * db, K_NORM)
    if tp > 1:
        rk.collective("all_gather", "tp", act // tp, act)
    rk.gemm("aten::mm", 2 * T * h * (m.heads + 2 * m.kv) * d / tp)
    attention(w, rk, layer, mb, T, backward=False)
    rk.gemm("aten::mm", 2 * T * h * h / tp)
    if tp > 1:
        rk.collective("reduce_scatter", "tp", act, act // tp)
    rk.memk("aten::native_layer_norm", 2 * sp * h * db, K_NORM)
    if tp > 1:
        rk.collective("all_gather", "tp", act // tp, act)
    if m.is_moe(layer):
        moe(w, rk, layer, mb, T, backward=False)
    else:
        rk.gemm("aten::mm", 2 * T * h * 2 * m.ffn_dim / tp)
        rk.memk("aten::silu", 3 * T * m.ffn_dim * db / tp, K_ACT)
        rk.gemm("aten::mm", 2 * T * m.ffn_dim * h / tp)
    if tp > 1:
        rk.collective("reduce_scatter", "tp", act, act // tp)
    # checkpointing keeps the block's input; its recompute in backward re-materialises the full set
    rk.memory(activation_bytes(w, T) if recompute or not L.activation_checkpointing else sp * h * db)


def layer_bwd(w: World, rk: Rank, layer: int, mb: int, T: int, part: str = "full") -> None:
    """part: 'full' (dgrad + wgrad), 'input' (dgrad only: zero-bubble I) or 'weight' (wgrad only: W)."""
    m, L = w.model, w.layout
    h, tp, db = m.hidden, L.tp, m.dtype_bytes
    d = h // m.heads
    sp = T // tp if tp > 1 and L.sequence_parallel else T
    act = T * h * db
    if part == "weight":
        k = 2 if not m.is_moe(layer) else 1
        rk.gemm("aten::mm", 2 * T * h * 2 * m.ffn_dim / tp, K_GEMM_BW)
        rk.gemm("aten::mm", 2 * T * m.ffn_dim * h / tp * k / 2, K_GEMM_BW)
        rk.gemm("aten::mm", 2 * T * h * ((m.heads + 2 * m.kv) * d + h) / tp, K_GEMM_BW)
        return
    if L.activation_checkpointing:
        layer_fwd(w, rk, layer, mb, T, recompute=True)
    if L.fsdp:
        fsdp_gather(w, rk, layer)
    wg = part == "full"
    if tp > 1:
        rk.collective("all_gather", "tp", act // tp, act)
    if m.is_moe(layer):
        moe(w, rk, layer, mb, T, backward=True)
    else:
        rk.gemm("aten::mm", 2 * T * m.ffn_dim * h / tp, K_GEMM_BW)
        if wg:
            rk.gemm("aten::mm", 2 * T * m.ffn_dim * h / tp, K_GEMM_BW)
        rk.memk("aten::silu_backward", 4 * T * m.ffn_dim * db / tp, K_ACT)
        rk.gemm("aten::mm", 2 * T * h * 2 * m.ffn_dim / tp, K_GEMM_BW)
        if wg:
            rk.gemm("aten::mm", 2 * T * h * 2 * m.ffn_dim / tp, K_GEMM_BW)
    if tp > 1:
        rk.collective("reduce_scatter", "tp", act, act // tp)
    rk.memk("aten::native_layer_norm_backward", 3 * sp * h * db, K_NORM_BW)
    if tp > 1:
        rk.collective("all_gather", "tp", act // tp, act)
    rk.gemm("aten::mm", 2 * T * h * h / tp, K_GEMM_BW)
    if wg:
        rk.gemm("aten::mm", 2 * T * h * h / tp, K_GEMM_BW)
    attention(w, rk, layer, mb, T, backward=True)
    rk.gemm("aten::mm", 2 * T * h * (m.heads + 2 * m.kv) * d / tp, K_GEMM_BW)
    if wg:
        rk.gemm("aten::mm", 2 * T * h * (m.heads + 2 * m.kv) * d / tp, K_GEMM_BW)
    if tp > 1:
        rk.collective("reduce_scatter", "tp", act, act // tp)
    rk.memk("aten::native_layer_norm_backward", 3 * sp * h * db, K_NORM_BW)
    rk.memory(-activation_bytes(w, T))
    if L.activation_checkpointing:
        rk.memory(-sp * h * db)


def attention(w: World, rk: Rank, layer: int, mb: int, T: int, backward: bool) -> None:
    """Flash attention; with cp > 1 a ring: per block, KV (and in backward dKV) pass to the next cp rank
    over P2P while the current block computes."""
    m, L = w.model, w.layout
    d = m.hidden // m.heads
    cp = L.cp
    mult = 2.5 if backward else 1.0
    name = "aten::_scaled_dot_product_flash_attention" + ("_backward" if backward else "")
    kname = K_FLASH_BW if backward else K_FLASH
    keys = T * cp if m.packed_attention else T * cp // max(1, m.micro_batch_size)
    full = 4 * T * keys * m.hidden / L.tp * 0.5 * mult  # causal
    if cp == 1:
        rk.gemm(name, full, kname)
        return
    g = w.topo.group(rk.r, "cp")
    pos = g.ranks.index(rk.r)
    nxt, prv = g.ranks[(pos + 1) % cp], g.ranks[(pos - 1) % cp]
    kv = T * 2 * m.kv * d * m.dtype_bytes // L.tp * (2 if backward else 1)
    phase = "b" if backward else "f"
    for j in range(cp):
        recv = None
        if j < cp - 1:
            tag = (rk.step, layer, mb, phase, j)
            rk.p2p(("cp", g.name, rk.r, nxt) + tag, "send", "cp", nxt, kv, P2P_STREAMS[("cp", "send", "next")])
            recv = rk.p2p(("cp", g.name, prv, rk.r) + tag, "recv", "cp", prv, kv, P2P_STREAMS[("cp", "recv", "prev")])
        rk.gemm(name, full / cp, kname)
        if recv is not None:
            rk.wait(recv)


def moe(w: World, rk: Rank, layer: int, mb: int, T: int, backward: bool) -> None:
    """Router (top-k), dispatch all_to_all with uneven splits, local experts, combine all_to_all."""
    m, L = w.model, w.layout
    h, db = m.hidden, m.dtype_bytes
    E, ep = m.experts, L.ep
    counts = route(w, rk, layer, mb, T)  # tokens this rank sends to each expert
    if not backward:
        rk.gemm("aten::mm", 2 * T * h * E / L.tp)
        rk.memk("aten::topk", T * E * 4, K_TOPK)
    per = E // ep
    g = w.topo.group(rk.r, "ep")
    members = g.ranks if g else (rk.r,)
    me = members.index(rk.r)
    send = [int(counts[j * per:(j + 1) * per].sum()) for j in range(len(members))]  # tokens (rows)
    recv_tok = np.zeros(per, np.int64)
    recv = []
    for peer in members:
        c = route(w, rk, layer, mb, T, rank=peer)
        recv.append(int(c[me * per:(me + 1) * per].sum()))
        recv_tok += c[me * per:(me + 1) * per]
    ffn = m.ffn_dim
    mult = 2.0 if backward else 1.0
    row = h * db
    bb = max(max(sum(send) - send[me], sum(recv) - recv[me]) * row, 1)
    if g is not None:
        rk.collective("all_to_all", "ep", sum(send) * row, sum(recv) * row, splits=(send, recv), bus_bytes=bb)
    for e in range(per):
        rk.gemm("aten::mm", 2 * int(recv_tok[e]) * h * 3 * ffn / L.tp * mult, K_GEMM_BW if backward else K_GEMM)
    if g is not None:
        rk.collective("all_to_all", "ep", sum(recv) * row, sum(send) * row, splits=(recv, send), bus_bytes=bb)


def route(w: World, rk: Rank, layer: int, mb: int, T: int, rank: int | None = None) -> np.ndarray:
    """Tokens × top_k assigned to each expert by rank `rank`'s router (seeded, biased by router_bias)."""
    r = rk.r if rank is None else rank
    key = (rk.step, layer, mb, r)
    got = w.routing.get(key)
    if got is None:
        m = w.model
        bias = np.zeros(m.experts)
        for e, b in w.faults.router_bias.items():
            bias[e] = b
        if m.router_skew > 0:
            bias = bias + np.random.default_rng((w.seed, rk.step, layer)).normal(0.0, m.router_skew, m.experts)
        rng = np.random.default_rng((w.seed, rk.step, layer, mb, r))
        logits = bias + rng.normal(0.0, 0.1, m.experts)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        pp_i, dp_i, cp_i, tp_i = w.topo.coords(r)
        t = T if rank is None else _tokens_of(w, dp_i)
        got = rng.multinomial(t * m.top_k, p)
        if m.capacity_factor > 0:
            got = np.minimum(got, math.ceil(m.capacity_factor * t * m.top_k / m.experts))
        w.routing[key] = got
    return got


def _tokens_of(w: World, dp_i: int) -> int:
    m = w.model
    t = m.micro_batch_size * m.seq // w.layout.cp
    us = w.faults.uneven_seq
    return int(t * us[1]) if us is not None and dp_i == us[0] else t


def activation_bytes(w: World, T: int) -> int:
    """Activations one layer keeps for backward per micro-batch (Korthikanti et al., flash attention, SP)."""
    m = w.model
    return int(T * m.hidden * 34 * m.dtype_bytes / 2 / w.layout.tp)


def fsdp_gather(w: World, rk: Rank, layer: int) -> None:
    L = w.layout
    n = L.dp * L.cp
    if n <= 1:
        return
    nbytes = w.model.layer_params(layer) // L.tp * w.model.dtype_bytes
    dim = "dp_cp" if L.cp > 1 and L.dp > 1 else ("dp" if L.dp > 1 else "cp")
    c = rk.collective("all_gather", dim, nbytes // n, nbytes, wait=False, stream=STREAMS["fsdp"])
    rk.wait(c)


# ---- schedules ---------------------------------------------------------------------------------------

_ACTION = re.compile(r"^(\d+)([A-Z]+)(\d+)$")


@lru_cache(maxsize=64)
def schedule_actions(schedule: str, pp: int, v: int, m: int, pp_rank: int) -> tuple[tuple[str, int, int], ...]:
    """(phase F/B/I/W, stage, microbatch) in issue order for one pp rank. GPipe and 1F1B are written out;
    interleaved 1F1B and zero bubble come from torch.distributed.pipelining's schedule classes."""
    if pp == 1:
        return tuple(a for i in range(m) for a in (("F", 0, i), ("B", 0, i)))
    if schedule == "gpipe":
        return tuple([("F", pp_rank, i) for i in range(m)] + [("B", pp_rank, i) for i in range(m)])
    if schedule == "1f1b":
        warm = min(pp - 1 - pp_rank, m)
        out = [("F", pp_rank, i) for i in range(warm)]
        f, b = warm, 0
        while b < m:
            if f < m:
                out.append(("F", pp_rank, f))
                f += 1
            out.append(("B", pp_rank, b))
            b += 1
        return tuple(out)
    return _torch_order(schedule, pp, v, m, pp_rank)


def _torch_order(schedule: str, pp: int, v: int, m: int, pp_rank: int) -> tuple[tuple[str, int, int], ...]:
    import torch
    from types import SimpleNamespace

    import torch.distributed.pipelining.schedules as S

    def stages(rank):
        return [SimpleNamespace(group_size=pp, group_rank=rank, stage_index=rank + j * pp, num_stages=pp * v,
                                is_first=rank + j * pp == 0, is_last=rank + j * pp == pp * v - 1, has_backward=True,
                                submod=torch.nn.Module(), stage_index_to_group_rank=None) for j in range(v)]

    cls = S.ScheduleInterleaved1F1B if schedule == "interleaved" else S.ScheduleInterleavedZeroBubble
    sched = cls(stages(pp_rank), m)
    out = []
    for a in sched.pipeline_order[pp_rank]:
        if a is None:
            continue
        mt = _ACTION.match(str(a))
        if mt:
            out.append((mt.group(2), int(mt.group(1)), int(mt.group(3))))
    return tuple(out)


# ---- one step on one rank ----------------------------------------------------------------------------

def build_step(w: World, rk: Rank, step: int, profiler_step: int) -> None:
    m, L, f = w.model, w.layout, w.faults
    rk.step = step
    rk.mark(f"ProfilerStep#{profiler_step}", True)
    data_ns = 300 * US
    if f.slow_data is not None and f.slow_data[0] == rk.r:
        data_ns += f.slow_data[1] * 1e6
    rk.host(DATA_LOADER, data_ns)
    if f.host_stall is not None and f.host_stall[0] == rk.r and step % max(1, f.host_stall[2]) == 0:
        rk.host("", f.host_stall[1] * 1e6, cat="")  # a stall that leaves no event (GC, a checkpoint write)
    T = tokens(w, rk)
    rk.memcpy("aten::copy_", MEMCPY_H2D, L.microbatches * T * 8)
    v = L.stages_per_rank
    stages = w.stages
    acts = schedule_actions(L.schedule, L.pp, v, L.microbatches, rk.pp_i)
    last_stage = L.num_stages - 1
    grads = GradSync(w, rk)
    done_bwd: dict[int, int] = {}
    for phase, s, i in acts:
        label = {"F": "fwd", "B": "bwd", "I": "bwd_input", "W": "bwd_weight"}[phase]
        rk.mark(f"pp:stage{s}:mb{i}:{label}", True)
        if phase == "F":
            if s > 0:
                c = _stage_p2p(w, rk, "recv", s - 1, s, i, "act", T)
                rk.wait(c)
            if s == 0:
                rk.memk("aten::embedding", T * m.hidden * m.dtype_bytes * 2, K_EMBED)
            for layer in stages[s]:
                layer_fwd(w, rk, layer, i, T)
            if s == last_stage:
                rk.gemm("aten::mm", 2 * T * m.hidden * m.vocab / L.tp)
                rk.memk("aten::_log_softmax", 3 * T * m.vocab * 4 / L.tp, K_SOFTMAX)
            else:
                _stage_p2p(w, rk, "send", s, s + 1, i, "act", T)
        elif phase in ("B", "I"):
            if s < last_stage:
                c = _stage_p2p(w, rk, "recv", s + 1, s, i, "grad", T)
                rk.wait(c)
            else:
                rk.memk("aten::_log_softmax_backward_data", 3 * T * m.vocab * 4 / L.tp, K_SOFTMAX)
                rk.gemm("aten::mm", 4 * T * m.hidden * m.vocab / L.tp, K_GEMM_BW)
            last_mb = done_bwd.get(s, 0) == L.microbatches - 1
            for layer in reversed(stages[s]):
                layer_bwd(w, rk, layer, i, T, "full" if phase == "B" else "input")
                if phase == "B" and last_mb:
                    grads.add(layer)
            if s > 0:
                _stage_p2p(w, rk, "send", s, s - 1, i, "grad", T)
            done_bwd[s] = done_bwd.get(s, 0) + 1
        else:  # W
            for layer in reversed(stages[s]):
                layer_bwd(w, rk, layer, i, T, "weight")
            if sum(1 for a in acts if a[0] == "W" and a[1] == s and a[2] <= i) == L.microbatches:
                for layer in reversed(stages[s]):
                    grads.add(layer)
        rk.mark(f"pp:stage{s}:mb{i}:{label}", False)
    grads.flush()
    optimizer(w, rk, grads)
    rk.sync()
    rk.mark(f"ProfilerStep#{profiler_step}", False)


def _stage_p2p(w: World, rk: Rank, op: str, src_stage: int, dst_stage: int, mb: int, kind: str, T: int) -> Coll:
    L, m = w.layout, w.model
    g = w.topo.group(rk.r, "pp")
    src = g.ranks[src_stage % L.pp]
    dst = g.ranks[dst_stage % L.pp]
    nbytes = T * m.hidden * m.dtype_bytes // (L.tp if L.sequence_parallel else 1)
    key = ("pp", g.name, src_stage, dst_stage, mb, kind, rk.step)
    peer = dst if op == "send" else src
    # one stream per (stage pair, direction, side): each carries its micro-batches in schedule order on both
    # ends, so no two P2P streams can wait on each other crosswise (zero-bubble / interleaved orders)
    stream = 51 + 4 * src_stage + (0 if kind == "act" else 2) + (0 if op == "send" else 1)
    return rk.p2p(key, op, "pp", peer, nbytes, stream)


class GradSync:
    """DDP buckets all-reduced as backward produces them (or after it with no_overlap); FSDP reduce-scatter
    per layer; expert gradients over the expert-data-parallel group."""

    def __init__(self, w: World, rk: Rank):
        self.w, self.rk = w, rk
        L = w.layout
        self.dim = "dp_cp" if L.cp > 1 and L.dp > 1 else ("dp" if L.dp > 1 else ("cp" if L.cp > 1 else None))
        self.bucket = 0
        self.limit = int(L.bucket_mb * 1e6)
        self.pending: list = []
        self.deferred: list[tuple[str, str, int]] = []

    def dense_bytes(self, layer: int) -> int:
        m, L = self.w.model, self.w.layout
        p = m.layer_params(layer)
        if m.is_moe(layer):
            p -= 3 * m.hidden * m.ffn_dim * m.experts
        return p // L.tp * 4  # fp32 gradients

    def expert_bytes(self, layer: int) -> int:
        m, L = self.w.model, self.w.layout
        if not m.is_moe(layer):
            return 0
        return 3 * m.hidden * m.ffn_dim * (m.experts // L.ep) // L.tp * 4

    def add(self, layer: int) -> None:
        if self.dim is None:
            return
        L = self.w.layout
        if L.fsdp:
            n = L.dp * L.cp
            b = self.dense_bytes(layer) + self.expert_bytes(layer)
            self.pending.append(self.rk.collective("reduce_scatter", self.dim, b, b // n, 4, wait=False,
                                                   stream=STREAMS["fsdp"]))
            return
        self.bucket += self.dense_bytes(layer)
        eb = self.expert_bytes(layer)
        if eb and self.w.topo.group(self.rk.r, "edp") is not None:
            self._issue("edp", eb)
        elif eb and self.w.layout.ep == 1:
            self.bucket += eb
        if self.bucket >= self.limit:
            self._issue(self.dim, self.bucket)
            self.bucket = 0

    def _issue(self, dim: str, nbytes: int) -> None:
        if self.w.faults.no_overlap:
            self.deferred.append((dim, nbytes))
        else:
            self.pending.append(self.rk.collective("all_reduce", dim, nbytes, nbytes, 4, wait=False))

    def flush(self) -> None:
        if self.dim is None:
            return
        if self.bucket:
            self._issue(self.dim, self.bucket + (self.w.model.embed_params // self.w.layout.tp * 4
                                                if self.rk.pp_i in (0, self.w.layout.pp - 1) else 0))
            self.bucket = 0
        for dim, nbytes in self.deferred:  # no overlap: after backward, one at a time
            self.rk.collective("all_reduce", dim, nbytes, nbytes, 4, wait=True)
        self.deferred = []
        for c in self.pending:
            self.rk.wait(c)


def optimizer(w: World, rk: Rank, grads: GradSync) -> None:
    m, L = w.model, w.layout
    rk.mark("Optimizer.step#AdamW.step", True)
    n = local_params(w, rk.r)
    chunks = 4
    for _ in range(chunks):
        rk.memk("aten::_fused_adamw_", n * 16 * 2 / chunks, K_ADAM)
    rk.mark("Optimizer.step#AdamW.step", False)


def local_params(w: World, rank: int) -> int:
    """Parameters this rank holds (tp/ep sharded; FSDP shards over dp × cp)."""
    m, L = w.model, w.layout
    pp_i = w.topo.coords(rank)[0]
    n = 0
    for s, layers in enumerate(w.stages):
        if s % L.pp != pp_i:
            continue
        for layer in layers:
            p = m.layer_params(layer)
            if m.is_moe(layer):
                e = 3 * m.hidden * m.ffn_dim * m.experts
                p = (p - e) + e // L.ep
            n += p // L.tp
    if pp_i == 0:
        n += m.embed_params // L.tp
    if pp_i == L.pp - 1:
        n += m.embed_params // L.tp
    if L.fsdp:
        n //= L.dp * L.cp
    return n


def make_world(model: ModelSpec, cluster: ClusterSpec, layout: ParallelLayout, faults: Faults, seed: int) -> World:
    validate_layout(layout, model)
    topo = build_topology(layout, cluster, faults.tp_across_hosts)
    w = World(model, cluster, layout, faults, seed, topo)
    split = dataclasses.replace(layout, stage_layers=faults.stage_layers)  # the stage-imbalance fault's split
    w.stages = tuple(tuple(layers) for layers in split.stage_layer_ids(model.layers))
    return w


def build_programs(w: World, steps: int, first_step: int = 1) -> list[list[Op]]:
    progs = []
    for r in range(w.topo.world):
        rk = Rank(w, r)
        static = static_bytes(w, r)
        rk.memory(static)
        for s in range(steps):
            build_step(w, rk, s, first_step + s)
        progs.append(rk.ops)
    return progs


def static_bytes(w: World, rank: int) -> int:
    """bf16 parameters + fp32 gradients + fp32 master copy and two Adam moments of this rank's shard."""
    n = local_params(w, rank)
    L = w.layout
    full = n * (L.dp * L.cp if L.fsdp else 1)
    return int(n * (4 + 12) + (full * 2 if not L.fsdp else n * 2))
