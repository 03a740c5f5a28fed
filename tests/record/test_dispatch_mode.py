"""CollectiveLoggingMode on a 1-rank gloo group in this process: what it logs for each c10d op."""

from __future__ import annotations

import pytest

from tests.record.conftest import load_comms


@pytest.fixture
def gloo_world():
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_logs_each_collective_with_group_seq_sizes(tmp_path, gloo_world):
    import torch
    import torch.distributed._functional_collectives as fc

    from tracekit.record.commlog import CommLog
    from tracekit.record.dispatch_mode import CollectiveLoggingMode

    dist = gloo_world
    sub = dist.new_group([0], group_desc="solo")
    log = CommLog(tmp_path / "comms.rank0.jsonl", 0, 1)
    mode = CollectiveLoggingMode(log, 0)
    mode.step = 7
    with mode:
        dist.all_reduce(torch.ones(5))
        dist.all_gather_into_tensor(torch.empty(4), torch.ones(4))
        dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3))
        dist.all_to_all_single(torch.empty(3), torch.ones(3), [3], [3])
        dist.broadcast(torch.ones(2, 2), 0)
        dist.barrier()
        dist.all_reduce(torch.ones(6, dtype=torch.float64), group=sub)
        y = fc.all_reduce(torch.ones(9), "sum", sub)
        y = y + 1  # waits on the functional collective
        torch.mm(torch.ones(2, 2), torch.ones(2, 2))  # not a collective: not logged
    assert mode.flush(final=True) == 8 and mode.errors == 0, mode.last_error
    log.close()
    _, entries, footer = load_comms(tmp_path / "comms.rank0.jsonl")
    assert footer["entries"] == 8
    got = [(e["process_group"][1], e["collective_seq_id"], e["profiling_name"], e["input_sizes"],
            e["output_sizes"]) for e in entries]
    assert got == [
        ("default_pg", 1, "gloo:all_reduce", [[5]], [[5]]),
        ("default_pg", 2, "gloo:all_gather", [[4]], [[4]]),
        ("default_pg", 3, "gloo:reduce_scatter", [[3]], [[3]]),
        ("default_pg", 4, "gloo:all_to_all", [[3]], [[3]]),
        ("default_pg", 5, "gloo:broadcast", [[2, 2]], [[2, 2]]),
        ("default_pg", 6, "gloo:barrier", [], []),
        ("solo", 1, "gloo:all_reduce", [[6]], [[6]]),
        ("solo", 2, "gloo:all_reduce", [[9]], [[9]]),
    ]
    assert entries[3]["in_split_sizes"] == [3] and entries[3]["out_split_sizes"] == [3]
    assert entries[6]["input_dtypes"] == ["Double"] and entries[0]["input_dtypes"] == ["Float"]
    assert all(e["step"] == 7 and e["group_ranks"] == [0] and e["rank"] == 0 for e in entries)
    # gloo's reduce_scatter Work has no future (getFuture not implemented): completion unknown.
    assert [e["state"] for e in entries] == ["completed"] * 2 + ["scheduled"] + ["completed"] * 5
    assert all(e["time_discovered_completed_ns"] >= e["time_created_ns"] for e in entries if e["state"] == "completed")
    assert {e["process_group"][0] for e in entries} == {dist.group.WORLD.group_name, sub.group_name}


class _LateCallbackFuture:
    """A future that already says done but runs its callbacks a moment later on another thread,
    as c10d does (waiters are woken before callbacks run)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def done(self) -> bool:
        return True

    def add_done_callback(self, fn) -> None:
        import threading

        threading.Timer(self.delay_s, fn, args=(self,)).start()


class _Work:
    def __init__(self, fut) -> None:
        self.fut = fut

    def get_future(self):
        return self.fut


def test_step_flush_waits_for_the_callback_of_a_completed_future(tmp_path):
    """A step boundary reached before the completion callback ran still writes that collective:
    otherwise a rank killed in the next step loses it (seen as a rank missing one DDP all-reduce)."""
    from tracekit.record.commlog import CommLog
    from tracekit.record.dispatch_mode import CollectiveLoggingMode, GroupInfo

    log = CommLog(tmp_path / "comms.rank0.jsonl", 0, 1)
    mode = CollectiveLoggingMode(log, 0)
    mode.step = 2
    info = GroupInfo(name="0", desc="default_pg", ranks=[0, 1], backend="gloo")
    done_soon = mode._new_entry("all_reduce", False, info, 1, [[68]], ["Float"], [[68]], ["Float"],
                                None, None, None)
    mode._attach_work(done_soon, _Work(_LateCallbackFuture(0.01)))
    assert mode.flush() == 1  # not final: settles the completed future, writes it
    still_running = mode._new_entry("all_reduce", False, info, 2, [[2]], ["Float"], [[2]], ["Float"],
                                    None, None, None)

    class _Running(_LateCallbackFuture):
        def done(self) -> bool:
            return False

        def add_done_callback(self, fn) -> None:
            self.fn = fn

    running = _Running(0.0)
    mode._attach_work(still_running, _Work(running))
    assert mode.flush(settle_s=0.01) == 0  # genuinely in flight: kept for a later flush
    running.fn(running)
    assert mode.flush() == 1
    log.close()
    _, entries, _ = load_comms(tmp_path / "comms.rank0.jsonl")
    assert [(e["input_sizes"], e["state"]) for e in entries] == [([[68]], "completed"), ([[2]], "completed")]
