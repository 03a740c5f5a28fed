"""Layout: process groups -> parallel dims (pg_desc, manifest, structure) and per-rank coordinates."""

from __future__ import annotations

from tracekit.derive.topology import analyze_layout, dim_from_desc

from tests.analyze.analyze_builders import build_store


def _ranks(n):
    return [{"rank": r, "world_size": n} for r in range(n)]


def _layout(store):
    return analyze_layout(store).section


def test_device_mesh_descs_give_dims_and_coordinates(tmp_path):
    # 2 (dp) x 2 (tp) mesh, DeviceMesh names: tp groups contiguous, dp groups strided
    groups = [
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
        {"pg_name": "1", "pg_desc": "mesh_dp", "ranks": [0, 2]},
        {"pg_name": "2", "pg_desc": "mesh_dp", "ranks": [1, 3]},
        {"pg_name": "3", "pg_desc": "mesh_tp", "ranks": [0, 1]},
        {"pg_name": "4", "pg_desc": "mesh_tp", "ranks": [2, 3]},
    ]
    sec = _layout(build_store(tmp_path, {"ranks": _ranks(4), "process_groups": groups}))
    by_name = {g["pg_name"]: g for g in sec["groups"]}
    assert by_name["0"]["dim"] == "world"
    assert {by_name[n]["dim"] for n in "12"} == {"dp"} and {by_name[n]["dim"] for n in "34"} == {"tp"}
    assert all(by_name[n]["inferred_from"] == "pg_desc" and by_name[n]["confidence"] == "high" for n in "1234")
    assert sec["mesh_shape"] == {"dp": 2, "tp": 2}
    coords = {r["rank"]: r["coords"] for r in sec["ranks"]}
    # rank = dp * 2 + tp
    assert coords == {r: {"dp": r // 2, "tp": r % 2} for r in range(4)}


def test_structure_only_inference_is_labelled_low_confidence(tmp_path):
    groups = [
        {"pg_name": "a", "pg_desc": None, "ranks": [0, 1]},
        {"pg_name": "b", "pg_desc": None, "ranks": [2, 3]},
        {"pg_name": "c", "pg_desc": "uid-17", "ranks": [0, 2]},
        {"pg_name": "d", "pg_desc": None, "ranks": [0, 1, 3]},   # irregular: stays unknown
    ]
    sec = _layout(build_store(tmp_path, {"ranks": _ranks(4), "process_groups": groups}))
    by_name = {g["pg_name"]: g for g in sec["groups"]}
    assert by_name["a"]["dim"] == "tp" and by_name["a"]["inferred_from"] == "structure"
    assert by_name["a"]["confidence"] == "low"
    assert by_name["c"]["dim"] == "dp" and by_name["c"]["confidence"] == "low"
    assert by_name["d"]["dim"] == "unknown" and by_name["d"]["inferred_from"] == "none"
    assert sec["dims_inferred_from"] == {"tp": "structure", "dp": "structure"}


def test_manifest_groups_name_the_default_group_and_undescribed_groups(tmp_path):
    manifest = {"world_size": 4, "layout": {"dp_mode": "fsdp", "groups": {
        "dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]], "pp": [[0], [1], [2], [3]]}}}
    groups = [
        {"pg_name": "9", "pg_desc": None, "ranks": [1, 3]},
        {"pg_name": "7", "pg_desc": None, "ranks": [2, 3]},
    ]
    sec = _layout(build_store(tmp_path, {"ranks": _ranks(4), "process_groups": groups}, manifest=manifest))
    by_name = {g["pg_name"]: g for g in sec["groups"]}
    assert by_name["9"]["dim"] == "fsdp" and by_name["9"]["inferred_from"] == "manifest"
    assert by_name["7"]["dim"] == "tp" and by_name["7"]["inferred_from"] == "manifest"
    # DDP over the whole world on the default group: the manifest says it is dp's group
    manifest2 = {"layout": {"groups": {"dp": [[0, 1]], "edp": [[0, 1]], "tp": [[0], [1]]}}}
    sec2 = _layout(build_store(tmp_path / "b", {"ranks": _ranks(2), "process_groups": [
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]}]}, manifest=manifest2))
    assert sec2["groups"][0]["dim"] == "dp" and sec2["groups"][0]["inferred_from"] == "manifest"


def test_groups_seen_only_in_collectives_are_included(tmp_path):
    coll = [{"rank": r, "source": "comms-log", "pg_name": "5", "pg_desc": "mesh_ep", "group_ranks": [0, 1],
             "op": "all_to_all", "seq": 1, "ts": 10, "dur": 5} for r in (0, 1)]
    sec = _layout(build_store(tmp_path, {"ranks": _ranks(2), "collectives": coll}))
    assert sec["groups"] == [{"pg_name": "5", "pg_desc": "mesh_ep", "dim": "ep", "ranks": [0, 1], "size": 2,
                              "inferred_from": "pg_desc", "confidence": "high"}]


def test_dim_from_desc_vocabulary():
    assert dim_from_desc("mesh_dp_shard") == "fsdp"
    assert dim_from_desc("mesh_dp_replicate") == "dp"
    assert dim_from_desc("mesh_cp") == "cp"
    assert dim_from_desc("mesh_pp") == "pp"
    assert dim_from_desc("mesh_edp") == "dp"
    assert dim_from_desc("default_pg") == "world"
    assert dim_from_desc("uid-3") is None and dim_from_desc(None) is None


def test_flattened_dp_cp_group_is_labelled_and_does_not_set_the_mesh(tmp_path):
    # dp2 x cp2 (rank = dp * 2 + cp): mesh_dp_cp spans all four ranks and is what DDP reduces over
    groups = [
        {"pg_name": "1", "pg_desc": "mesh_dp", "ranks": [0, 2]},
        {"pg_name": "2", "pg_desc": "mesh_dp", "ranks": [1, 3]},
        {"pg_name": "3", "pg_desc": "mesh_cp", "ranks": [0, 1]},
        {"pg_name": "4", "pg_desc": "mesh_cp", "ranks": [2, 3]},
        {"pg_name": "5", "pg_desc": "mesh_dp_cp", "ranks": [0, 1, 2, 3]},
    ]
    sec = _layout(build_store(tmp_path, {"ranks": _ranks(4), "process_groups": groups}))
    by_name = {g["pg_name"]: g for g in sec["groups"]}
    assert by_name["5"]["dim"] == "dp" and by_name["5"]["flattened"] == ["dp", "cp"]
    assert all("flattened" not in by_name[n] for n in "1234")
    assert list(sec["mesh_shape"].items()) == [("dp", 2), ("cp", 2)]  # outermost first
    coords = {r["rank"]: r["coords"] for r in sec["ranks"]}
    assert coords == {r: {"dp": r // 2, "cp": r % 2} for r in range(4)}


def test_flattened_group_stands_in_when_no_basic_group_shows_its_dim(tmp_path):
    groups = [{"pg_name": "5", "pg_desc": "mesh_dp_cp", "ranks": [0, 1, 2, 3]}]
    sec = _layout(build_store(tmp_path, {"ranks": _ranks(8), "process_groups": groups}))
    assert sec["mesh_shape"] == {"dp": 4}
