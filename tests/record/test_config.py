"""RecordConfig / ProfileSchedule: the step window must be exactly torch.profiler's."""

from __future__ import annotations

import pytest

from tracekit.record.config import ProfileSchedule, RecordConfig, config_from_env, parse_rank_list, CONFIG_ENV


@pytest.mark.parametrize("wait,warmup,active,repeat,skip_first", [
    (1, 1, 3, 1, 0), (0, 0, 1, 2, 0), (2, 1, 2, 3, 5), (1, 0, 2, 0, 1), (3, 2, 1, 2, 0),
])
def test_schedule_phase_matches_torch_profiler(wait, warmup, active, repeat, skip_first):
    from torch.profiler import ProfilerAction, schedule

    torch_fn = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
    ours = ProfileSchedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
    names = {ProfilerAction.NONE: "none", ProfilerAction.WARMUP: "warmup",
             ProfilerAction.RECORD: "active", ProfilerAction.RECORD_AND_SAVE: "active_last"}
    for step in range(60):
        assert ours.phase(step) == names[torch_fn(step)], step
    recorded = [s for s in range(60) if torch_fn(s) in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)]
    assert ours.active_steps(limit=60)[: len(recorded)] == recorded


def test_schedule_rejects_bad_values():
    with pytest.raises(ValueError, match="--active"):
        ProfileSchedule(active=0)
    with pytest.raises(ValueError, match="--wait"):
        ProfileSchedule(wait=-1)


def test_config_round_trips_through_env(tmp_path):
    cfg = RecordConfig(out_dir=str(tmp_path), schedule=ProfileSchedule(wait=2, warmup=0, active=4, repeat=2),
                       ranks=[0, 3], step_on="manual", log_collectives=False)
    back = config_from_env({CONFIG_ENV: cfg.to_json()})
    assert back == cfg
    assert config_from_env({}) is None


def test_rank_selection():
    assert parse_rank_list("0,8,16") == [0, 8, 16]
    assert parse_rank_list("3-5, 1") == [1, 3, 4, 5]
    with pytest.raises(ValueError, match="bad rank"):
        parse_rank_list("0,x")
    with pytest.raises(ValueError, match="either"):
        RecordConfig(out_dir="/tmp", ranks=[0], ranks_per_group=1)
    cfg = RecordConfig(out_dir="/tmp", ranks=[0, 8])
    assert [r for r in range(16) if cfg.is_profiled(r, r % 8)] == [0, 8]
    per_group = RecordConfig(out_dir="/tmp", ranks_per_group=2)
    assert [r for r in range(16) if per_group.is_profiled(r, r % 8)] == [0, 1, 8, 9]
    assert RecordConfig(out_dir="/tmp").is_profiled(5, None)


def test_time_based_window_length():
    from tracekit.record.config import ProfileSchedule

    s = ProfileSchedule(active=3, min_window_ms=300, max_active=100)
    assert s.active_for(4_000_000) == 75  # 300 ms / 4 ms
    assert s.active_for(7_000_000) == 43  # ceil(300 / 7)
    assert s.active_for(1_000_000) == 100  # capped
    assert s.active_for(500_000_000) == 3  # long steps: the minimum count
    assert ProfileSchedule(active=3).active_for(1_000_000) == 3  # no time target: exactly `active`
    import pytest

    with pytest.raises(ValueError):
        ProfileSchedule(active=5, max_active=4, min_window_ms=10)


@pytest.mark.parametrize("log_collectives", [True, False])
def test_the_collective_hook_looks_its_ops_up_in_the_warmup_step(tmp_path, log_collectives):
    """The hook's one-off op lookup (10-25 ms on the 2-core box) is made when the warmup step begins, not
    inside the first profiled step, where it read as the rank's idle time and a late arrival."""
    from tracekit.record.c10d_hook import c10d_ops
    from tracekit.record.recorder import RankRecorder

    c10d_ops.cache_clear()
    cfg = RecordConfig(out_dir=str(tmp_path), schedule=ProfileSchedule(wait=0, warmup=1, active=1), ranks=[5],
                       log_collectives=log_collectives, clock_barrier=False, flight_recorder=False)
    RankRecorder(cfg, first_step=0, mode="api")  # step 0, the warmup step, begins
    assert c10d_ops.cache_info().currsize == int(log_collectives)
