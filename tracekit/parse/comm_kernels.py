"""Which device kernels are communication, from one declared table (DESIGN §10: "communication is not
only NCCL").

Each entry names a library, a regular expression searched in the kernel's name (as the profiler writes
it: `void deep_ep::intranode::dispatch<8, 768, 6144>(...)`), and the collective op it implements:
a fixed op, `NAME` (the op is spelled in the kernel name: allreduce / allgather / reducescatter /
alltoall / broadcast ...), or None where one kernel serves several ops or exchanges metadata only.
The names were read in each project's public sources (cited per entry). A kernel matching an entry is
`kernels.kind = comm`: its time is communication in the breakdown, overlap and exposure. Bytes are
known only where the trace's collective args give them (no bandwidth from a name alone).

Users add patterns (kernels of libraries not listed, in-house collectives) with
`tracekit analyze/parse --comm-kernel REGEX[=OP]` or `--comm-kernels FILE` (JSON or TOML, see
`load_pattern_file`); the CLI hands them to the parsers (also in worker processes) through the
`TRACEKIT_COMM_KERNELS` environment variable (a JSON list of {"regex", "op", "library"}).
User patterns are searched before the declared table.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ENV_VAR = "TRACEKIT_COMM_KERNELS"
NAME = "name"
"""Op marker: the op is spelled in the kernel's name."""


@dataclass(frozen=True)
class CommKernelPattern:
    library: str
    regex: str
    op: str | None
    """A collective op (tracekit.tables.schema.COLLECTIVE_OPS), NAME, or None (several ops / metadata)."""
    source: str = ""
    """Where the kernel names were read (repository and path), or "user"."""


COMM_KERNELS: tuple[CommKernelPattern, ...] = (
    # NCCL ncclKernel_AllReduce_RING_LL_Sum_float / ncclDevKernel_AllGather_RING_LL (NVIDIA/nccl
    # src/device/generate.py); RCCL keeps the names and adds ncclDevKernel_Generic (ROCm/rccl).
    CommKernelPattern("nccl/rccl", r"^(?:nccl|rccl)(?:Dev)?Kernel_?", NAME, "NVIDIA/nccl src/device; ROCm/rccl"),
    # RCCL's MSCCL interpreter kernels mscclKernel_<op>_<type>_<proto> (ROCm/rccl src/device/msccl_kernel_impl.h):
    # the algorithm, not the name, says which collective runs.
    CommKernelPattern("rccl-msccl", r"^(?:void\s+)?mscclKernel_", None, "ROCm/rccl src/device/msccl_kernel_impl.h"),
    # DeepEP expert-parallel token exchange: deep_ep::{intranode,internode,internode_ll}::{dispatch,combine},
    # notify_dispatch / cached_notify_* (counts and layout exchange), barrier
    # (deepseek-ai/DeepEP csrc/kernels/intranode.cu, internode.cu, internode_ll.cu, runtime.cu).
    CommKernelPattern("deepep", r"(?:^|[\s:*&<(])(?:deep_ep::)?(?:intranode|internode|internode_ll)::"
                      r"(?:dispatch|combine)\b", "all_to_all", "deepseek-ai/DeepEP csrc/kernels/intranode.cu"),
    CommKernelPattern("deepep", r"(?:^|[\s:*&<(])(?:deep_ep::)?(?:intranode|internode|internode_ll)::"
                      r"\w*notify\w*", None, "deepseek-ai/DeepEP csrc/kernels/internode.cu"),
    CommKernelPattern("deepep", r"(?:^|[\s:*&<(])deep_ep::(?:intranode|internode|internode_ll)::barrier\b", "barrier",
                      "deepseek-ai/DeepEP csrc/kernels/runtime.cu"),
    # NVSHMEM device collectives and runtime kernels (nvshmemx_*_allreduce..., nvshmemi_*; NVIDIA NVSHMEM docs).
    CommKernelPattern("nvshmem", r"(?:^|[\s:*&<(])nvshmem[ix]?_\w*", NAME, "NVIDIA NVSHMEM device API"),
    # TransformerEngine userbuffers (TP comm overlap): userbuffers_fp16_sum_inplace_gpu_rr_rs /
    # _rr_ag / _rw, kuserbuffers_pullsend / pushrecv ... (NVIDIA/TransformerEngine
    # transformer_engine/common/comm_gemm_overlap/userbuffers/userbuffers.cu).
    CommKernelPattern("te-userbuffers", r"(?:^|[\s:*&<(])userbuffers_\w*_rs\b", "reduce_scatter",
                      "NVIDIA/TransformerEngine userbuffers.cu"),
    CommKernelPattern("te-userbuffers", r"(?:^|[\s:*&<(])userbuffers_\w*_ag\b", "all_gather",
                      "NVIDIA/TransformerEngine userbuffers.cu"),
    CommKernelPattern("te-userbuffers", r"(?:^|[\s:*&<(])userbuffers_\w*sum_inplace\w*", "all_reduce",
                      "NVIDIA/TransformerEngine userbuffers.cu"),
    CommKernelPattern("te-userbuffers", r"(?:^|[\s:*&<(])kuserbuffers_(?:pull|push)send\w*", "send",
                      "NVIDIA/TransformerEngine userbuffers.cu"),
    CommKernelPattern("te-userbuffers", r"(?:^|[\s:*&<(])kuserbuffers_(?:pull|push)recv\w*", "recv",
                      "NVIDIA/TransformerEngine userbuffers.cu"),
    CommKernelPattern("te-userbuffers", r"(?:^|[\s:*&<(])k?userbuffers_\w+", None,
                      "NVIDIA/TransformerEngine userbuffers.cu"),
    # vLLM custom all-reduce (also in SGLang's sgl_kernel): vllm::cross_device_reduce_1stage / _2stage
    # (vllm-project/vllm csrc/custom_all_reduce.cuh).
    CommKernelPattern("vllm/sglang-custom-ar", r"cross_device_reduce_\w*stage", "all_reduce",
                      "vllm-project/vllm csrc/custom_all_reduce.cuh"),
    # TensorRT-LLM custom all-reduce (also SGLang's trt_reduce): oneShotAllReduceKernel / twoShotAllReduceKernel
    # (NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/customAllReduceKernels.cu).
    CommKernelPattern("trtllm-custom-ar", r"(?:one|two)Shot\w*AllReduce\w*Kernel", "all_reduce",
                      "NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/customAllReduceKernels.cu"),
    # SGLang/vLLM quick all-reduce on ROCm: quickreduce::allreduce_prototype_* (vllm csrc/quickreduce).
    CommKernelPattern("quickreduce", r"quickreduce::\w*", "all_reduce", "vllm-project/vllm csrc/quickreduce"),
    # MSCCL++: mscclpp::...::allreduceAllPairs / allreduce7 / allgather6 ... (microsoft/mscclpp
    # src/ext/collectives, apps/nccl/src/allreduce.hpp).
    CommKernelPattern("mscclpp", r"mscclpp::", NAME, "microsoft/mscclpp apps/nccl/src/allreduce.hpp"),
    # oneCCL SYCL collectives on Intel GPUs, in namespace ccl:: (oneapi-src/oneCCL
    # src/coll/algorithms/allreduce/sycl/allreduce_sycl.cpp).
    CommKernelPattern("oneccl", r"(?:^|[\s:*&<(])(?:ccl|oneccl)::\w*(?:allreduce|allgather|reduce_scatter|alltoall|"
                      r"broadcast|bcast)", NAME, "oneapi-src/oneCCL src/coll/algorithms/*/sycl"),
)

# op words as kernel names spell them (lower case, `_` removed), longest first
_NAME_OPS = (("reducescatter", "reduce_scatter"), ("allgather", "all_gather"), ("fcollect", "all_gather"),
             ("alltoall", "all_to_all"), ("allreduce", "all_reduce"), ("broadcast", "broadcast"),
             ("bcast", "broadcast"), ("sendrecv", None), ("barrier", "barrier"), ("reduce", "reduce"),
             ("gather", "gather"), ("scatter", "scatter"), ("send", "send"), ("recv", "recv"))
_NCCL_OP = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_?([A-Za-z]*)", re.I)


def op_from_name(name: str) -> str | None:
    """The collective spelled in a kernel name (allreduceAllPairs → all_reduce), else None."""
    key = re.sub(r"[^a-z]", "", name.lower())
    return next((op for word, op in _NAME_OPS if word in key), None)


@dataclass(frozen=True)
class _Compiled:
    pattern: CommKernelPattern
    regex: re.Pattern


def parse_user_pattern(text: str) -> CommKernelPattern:
    """`REGEX[=OP]` (OP a collective op such as all_reduce, or omitted: unknown) → a user pattern.
    The regex is checked here, so a bad one is refused with its error."""
    regex, op = text, None
    head, sep, tail = text.rpartition("=")
    if sep and head and re.fullmatch(r"[A-Za-z_]+", tail) and op_from_name(tail) is not None:
        regex, op = head, op_from_name(tail)
    re.compile(regex)
    return CommKernelPattern("user", regex, op, "user")


def load_pattern_file(path: str | Path) -> list[CommKernelPattern]:
    """Patterns from a JSON or TOML file: a list (or `{"patterns": [...]}` / TOML `[[patterns]]`) of
    {"regex": ..., "op": ... (optional), "library": ... (optional)}."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    if p.suffix.lower() == ".toml":
        import tomllib

        doc = tomllib.loads(text)
    else:
        doc = json.loads(text)
    items = doc.get("patterns", []) if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise ValueError(f"{p}: expected a list of patterns")
    out = []
    for it in items:
        if isinstance(it, str):
            out.append(parse_user_pattern(it))
            continue
        if not isinstance(it, dict) or not isinstance(it.get("regex"), str):
            raise ValueError(f"{p}: each pattern needs a 'regex' string")
        base = parse_user_pattern(it["regex"] + (f"={it['op']}" if it.get("op") else ""))
        out.append(CommKernelPattern(str(it.get("library") or "user"), base.regex, base.op, "user"))
    return out


def user_patterns_env(patterns: list[CommKernelPattern]) -> str:
    """The value of TRACEKIT_COMM_KERNELS that hands `patterns` to the parsers."""
    return json.dumps([{"regex": p.regex, "op": p.op, "library": p.library} for p in patterns])


@lru_cache(maxsize=8)
def _table(env_value: str) -> tuple[_Compiled, ...]:
    user = []
    if env_value:
        for it in json.loads(env_value):
            user.append(CommKernelPattern(str(it.get("library") or "user"), it["regex"], it.get("op"), "user"))
    return tuple(_Compiled(p, re.compile(p.regex)) for p in (*user, *COMM_KERNELS))


def active_table() -> tuple[_Compiled, ...]:
    return _table(os.environ.get(ENV_VAR, ""))


@lru_cache(maxsize=65536)
def _match(name: str, env_value: str) -> tuple[str, str | None] | None:
    for c in _table(env_value):
        if c.regex.search(name):
            op = c.pattern.op
            if op == NAME:
                m = _NCCL_OP.match(name)
                op = op_from_name(m.group(1)) if m else op_from_name(name)
            return c.pattern.library, op
    return None


def match_comm_kernel(name: str | None) -> tuple[str, str | None] | None:
    """(library, op or None) of a communication kernel's name; None for any other kernel."""
    if not name:
        return None
    return _match(name, os.environ.get(ENV_VAR, ""))
