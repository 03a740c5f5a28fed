"""On NCCL the comms log takes the Flight Recorder's entry for each collective it also holds."""

from __future__ import annotations

import json

from tracekit.record.commlog import CommLog, prefer_flight_recorder


def test_flight_recorder_entries_replace_ours_by_group_and_seq(tmp_path):
    path = tmp_path / "comms.rank0.jsonl"
    log = CommLog(path, 0, 2)
    common = dict(pg_desc="default_pg", time_started_ns=None, time_completed_ns=None, input_dtypes=["Float"],
                  output_dtypes=["Float"], group_ranks=[0, 1], source="c10d_dispatcher")
    log.record(pg_name="0", profiling_name="nccl:all_reduce", time_created_ns=100, input_sizes=[[8]],
               output_sizes=[[8]], seq=7, step=2, **common)
    log.record(pg_name="0", profiling_name="nccl:all_gather", time_created_ns=200, input_sizes=[[4]],
               output_sizes=[[8]], seq=8, step=2, **common)
    log.record(pg_name="0", profiling_name="nccl:send", time_created_ns=300, input_sizes=[[3]], output_sizes=[[3]],
               seq=1, step=2, is_p2p=True, peer=1, **common)
    log.close()
    fr = [  # seq 7 of group "0" (ours), seq 7 of another group, a p2p entry with p2p seq 1
        {"process_group": ["0", "default_pg"], "collective_seq_id": 7, "p2p_seq_id": 0, "profiling_name": "nccl:all_reduce",
         "input_sizes": [[8]], "output_sizes": [[8]], "time_created_ns": 90, "time_discovered_started_ns": 150,
         "time_discovered_completed_ns": 180, "duration_ms": 0.02, "state": "completed", "is_p2p": False},
        {"process_group": ["1", "tp"], "collective_seq_id": 8, "profiling_name": "nccl:all_reduce", "state": "completed"},
        {"process_group": ["0", "default_pg"], "collective_seq_id": 0, "p2p_seq_id": 1, "profiling_name": "nccl:send 0->1",
         "state": "completed", "is_p2p": True},
    ]
    assert prefer_flight_recorder(path, fr) == 1
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[-1]["type"] == "footer"
    ar, ag, send = lines[1:4]
    assert ar["source"] == "flight_recorder" and ar["time_discovered_completed_ns"] == 180 and ar["duration_ms"] == 0.02
    assert ar["time_created_ns"] == 90 and ar["logged"]["time_created_ns"] == 100 and ar["step"] == 2
    assert ag["source"] == "c10d_dispatcher" and "logged" not in ag
    assert send["source"] == "c10d_dispatcher" and send["p2p_seq_id"] == 1
