"""PyTorch's notices about the profiler tracekit turns on are held back and counted; nothing else is.

The notice lines are copied from a demo run's terminal (torch 2.13, 16 gloo ranks: 32 Kineto lines, 16
CPUAllocator lines); the other lines are what a user's program prints and must pass untouched."""

from __future__ import annotations

import os

import pytest

from tracekit.record.notices import NoticeFilter, notice_of, notices_held

NOTICES = [
    b"USDT:2026-12-06 04:56:54 18970:18970 SyncActivityProfilerHandler.cpp:52] profiler_start\n",
    b"USDT:2026-12-06 04:56:54 18970:18970 SyncActivityProfilerHandler.cpp:59] profiler_stop\n",
    b"[rank9]:[W1206 04:56:51.904620398 CPUAllocator.cpp:245] Memory block of unknown size was allocated before "
    b"the profiling started, profiler results will not include the deallocation event\n",
    b"[W1206 05:03:04.271767924 CPUAllocator.cpp:245] Memory block of unknown size was allocated before the "
    b"profiling started, profiler results will not include the deallocation event\n",
]
USER = [
    b"Traceback (most recent call last):\n",
    b"RuntimeError: profiler_start failed in my code\n",
    b"[rank3]:[W1206 04:56:51.904620398 ProcessGroupGloo.cpp:100] Warning: something about the user's job\n",
    b"WARNING:2026-12-06 04:56:54 18970:18970 SyncActivityProfilerHandler.cpp:52] profiler_start\n",  # not USDT
    b"USDT:2026-12-06 04:56:54 18970:18970 SyncActivityProfilerHandler.cpp:52] profiler_start and more\n",
    b"loss 5.55\n",
]


def test_only_the_notices_are_held():
    f = NoticeFilter()
    kept = [line for line in NOTICES + USER if f.keep(line)]
    assert kept == USER
    assert [notice_of(line) is not None for line in NOTICES] == [True] * 4
    assert sum(f.counts.values()) == 4 and len(f.counts) == 2
    assert f.summary("x").startswith("[x] 4 lines of PyTorch profiler notices not shown (2 ")
    assert NoticeFilter().summary("x") is None


def test_held_around_a_call(tmp_path, capfd):
    f = NoticeFilter()
    spool = tmp_path / ".stderr-held"
    with notices_held(f, spool):
        for line in NOTICES[:2] + USER[:2]:
            os.write(2, line)
    err = capfd.readouterr().err
    assert err.encode() == b"".join(USER[:2])
    assert sum(f.counts.values()) == 2 and not spool.exists()


def test_runtime_filter_keeps_each_ranks_lines_whole(capsys):
    """Two ranks writing pieces of lines (Kineto writes a line and its newline apart): the parent's filter
    reads a pipe per rank, so lines come out whole, notices counted, the rest in order per rank."""
    from instrumented_runtime.launch import _StderrFilter

    pipes = [os.pipe(), os.pipe()]
    pieces = {0: [NOTICES[0][:-1], b"\n", USER[0], USER[1][:10]], 1: [NOTICES[2][:30], USER[5][:0], NOTICES[2][30:],
                                                                    USER[5]]}
    for r, chunks in pieces.items():
        for c in chunks:
            os.write(pipes[r][1], c)
        os.close(pipes[r][1])
    filt = _StderrFilter([r for r, _ in pipes])
    filt.run()
    out = capsys.readouterr().err.splitlines(keepends=True)
    assert sorted(out) == sorted([USER[0].decode(), USER[1][:10].decode(), USER[5].decode()])
    assert out.index(USER[0].decode()) < out.index(USER[1][:10].decode())
    assert sum(filt.notices.counts.values()) == 2


@pytest.mark.slow  # ~10 s alone (torch import, 2 forked ranks that fail at once); 35 s on the loaded box
def test_a_failing_ranks_traceback_still_reaches_the_terminal(tmp_path):
    """The reference runtime filters its ranks' stderr: a rank that fails (gloo finds no such interface)
    still prints its whole traceback, before the runtime's own error line."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="tracekit-no-such-if0", PYTHONPATH=str(repo))
    res = subprocess.run([sys.executable, "-m", "instrumented_runtime", "--dp", "2", "--steps", "3",
                          "--out", str(tmp_path / "run")], cwd=repo, env=env, capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 1
    err = res.stderr
    assert "failed:\nTraceback (most recent call last):" in err and "tracekit-no-such-if0" in err
    assert err.index("Traceback") < err.index("python -m instrumented_runtime: ranks")
