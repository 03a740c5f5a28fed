"""Communication kernels other than NCCL's count as communication (tracekit/parse/comm_kernels.py).

Expected numbers come from the generator's own intervals (custom_comm_gen.Layout), never from tracekit.
"""

from __future__ import annotations

import pytest

from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.comm_kernels import COMM_KERNELS, ENV_VAR, match_comm_kernel, parse_user_pattern, user_patterns_env
from tracekit.parse.run import parse_run

from tests.gpu_semantics.custom_comm_gen import Layout, write


def _analyze(tmp_path, layout: Layout):
    write(layout, tmp_path / "traces")
    store = parse_run(tmp_path / "traces", tmp_path / "store", progress=False).store
    return store, analyze_store(store, AnalysisConfig(isolate_analyzer_errors=False, advice=False))


def test_deepep_kernels_are_communication_and_comm_share_matches_the_generator(tmp_path):
    layout = Layout(world=4, steps=3).build()
    store, a = _analyze(tmp_path, layout)
    kinds = {(r["name"].split("(")[0], r["kind"]) for r in store.table("kernels", ["name", "kind"]).to_pylist()}
    assert {k for n, k in kinds if "deep_ep::" in n} == {"comm"}
    rows = {r["rank"]: r for r in a["ranks"]}
    assert set(rows) == set(range(4))
    for r in range(4):
        span, comm_ns, both = layout.comm_share(r)
        got = rows[r]
        assert got["steps"] == 3
        assert got["step_ns"] == span
        # comm share within 1 pp of the generator's (exact here: the same integer intervals)
        assert abs(got["comm_ns"] / got["step_ns"] - comm_ns / span) < 0.01
        assert got["comm_ns"] == comm_ns
        assert got["exposed_comm_ns"] == comm_ns - both
        assert got["overlap_ratio"] == pytest.approx(both / comm_ns, abs=1e-6)
    # the ops come from the table: dispatch/combine exchange tokens all-to-all, notify has no single op
    ops = {r["name"].split("(")[0].split("::")[-1].split("<")[0]: r["collective_op"]
           for r in store.table("kernels", ["name", "kind", "collective_op"]).to_pylist() if r["kind"] == "comm"}
    assert ops["dispatch"] == "all_to_all" and ops["combine"] == "all_to_all" and ops["notify_dispatch"] == "unknown"
    # no bytes are known from a name: no bandwidth row is made up
    bw = a["sections"].get("bandwidth") or {}
    assert not [x for x in bw.get("rows", []) if x.get("op") == "all_to_all"]


def test_a_user_pattern_makes_an_unknown_library_communication(tmp_path, monkeypatch):
    names = ("void acme::ring_push_kernel<4>(float*)", "void acme::ring_pull_kernel<4>(float*)")
    layout = Layout(world=2, steps=2, comm_names=names, seed=3).build()
    _, plain = _analyze(tmp_path / "plain", layout)
    assert all(r["comm_ns"] == 0 for r in plain["ranks"])  # not in the table: compute
    monkeypatch.setenv(ENV_VAR, user_patterns_env([parse_user_pattern(r"acme::ring_\w+_kernel=all_reduce")]))
    _, a = _analyze(tmp_path / "user", layout)
    for row in a["ranks"]:
        span, comm_ns, both = layout.comm_share(row["rank"])
        assert (row["step_ns"], row["comm_ns"], row["exposed_comm_ns"]) == (span, comm_ns, comm_ns - both)


@pytest.mark.parametrize("name, library, op", [
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "nccl/rccl", "all_gather"),
    ("ncclDevKernel_Generic(ncclDevComm*, unsigned long, ncclWork*)", "nccl/rccl", None),
    ("void deep_ep::internode::notify_dispatch<false, 2>(int const*, int*, int)", "deepep", None),
    ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*, float*)", "deepep", "all_to_all"),
    ("void userbuffers_fp16_sum_inplace_gpu_rr_ag<8>(int, int)", "te-userbuffers", "all_gather"),
    ("void kuserbuffers_pushrecv(int, int, int*)", "te-userbuffers", "recv"),
    ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*)", "vllm/sglang-custom-ar", "all_reduce"),
    ("void tensorrt_llm::kernels::oneShotAllReduceKernel<half, 8, false>(AllReduceParams)", "trtllm-custom-ar",
     "all_reduce"),
    ("void mscclpp::collective::allgather6<false>(void*, void*)", "mscclpp", "all_gather"),
    ("nvshmemx_float_sum_reduce_block_kernel", "nvshmem", "reduce"),
    ("mscclKernel_Sum_float_LL128", "rccl-msccl", None),
])
def test_table_entries(name, library, op):
    assert match_comm_kernel(name) == (library, op)


@pytest.mark.parametrize("name", [
    "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*)",  # routing layout: compute
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int)",
    "void moe_combine_kernel<float>(float*)", "Memcpy DtoD (Device -> Device)", "triton_poi_fused_add_0",
])
def test_compute_kernels_stay_compute(name):
    assert match_comm_kernel(name) is None


def test_every_table_entry_cites_its_source():
    assert all(p.source for p in COMM_KERNELS)


def test_user_pattern_syntax():
    assert parse_user_pattern("foo=bar=all_to_all").regex == "foo=bar" and parse_user_pattern("x=alltoall").op == "all_to_all"
    assert parse_user_pattern("a_b=c").op is None and parse_user_pattern("a_b=c").regex == "a_b=c"
    with pytest.raises(Exception):
        parse_user_pattern("([unclosed")


def test_cli_options_hand_patterns_to_the_parser(tmp_path, monkeypatch):
    """`tracekit parse --comm-kernel REGEX=OP` and `--comm-kernels FILE` (TOML) make the named kernels
    communication; a bad regex is a usage error naming the option."""
    from typer.testing import CliRunner

    from tracekit.cli.main import app

    monkeypatch.setenv(ENV_VAR, "")  # the CLI sets it for its workers: restored after the test
    layout = Layout(world=2, steps=2, comm_names=("void acme::ring_push_kernel<4>(float*)",), seed=5).build()
    write(layout, tmp_path / "traces")
    res = CliRunner().invoke(app, ["parse", str(tmp_path / "traces"), "--out", str(tmp_path / "s1"), "-q", "-j", "1",
                                   "--comm-kernel", r"acme::ring_\w+=all_reduce"])
    assert res.exit_code == 0, res.output
    from tracekit.tables.store import RunStore
    rows = RunStore(tmp_path / "s1").table("kernels", ["name", "kind", "collective_op"]).to_pylist()
    assert {(r["kind"], r["collective_op"]) for r in rows if "acme" in r["name"]} == {("comm", "all_reduce")}
    monkeypatch.setenv(ENV_VAR, "")
    (tmp_path / "p.toml").write_text('[[patterns]]\nregex = "acme::ring_push"\nop = "all_to_all"\nlibrary = "acme"\n')
    res = CliRunner().invoke(app, ["parse", str(tmp_path / "traces"), "--out", str(tmp_path / "s2"), "-q", "-j", "1",
                                   "--comm-kernels", str(tmp_path / "p.toml")])
    assert res.exit_code == 0, res.output
    rows = RunStore(tmp_path / "s2").table("kernels", ["name", "kind", "collective_op"]).to_pylist()
    assert {(r["kind"], r["collective_op"]) for r in rows if "acme" in r["name"]} == {("comm", "all_to_all")}
    res = CliRunner().invoke(app, ["parse", str(tmp_path / "traces"), "--out", str(tmp_path / "s3"), "-q",
                                   "--comm-kernel", "([bad"])
    assert res.exit_code != 0 and "--comm-kernel" in res.output
