#!/usr/bin/env bash
# The test command: sets up .venv if needed, then runs the suite and the long set (pytest args pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install_chromium.sh
export TRACEKIT_SHARED_TRACES=${TRACEKIT_SHARED_TRACES:-$(cd .. && pwd)/shared/traces}
# Two xdist workers (the target box has 2 cores); whole files go to one worker (--dist loadfile) so a
# file's module/session fixtures (e.g. the detection matrix's runtime runs) are built once, in collection
# order (--no-loadscope-reorder; xdist would sort files by their number of tests): tests/conftest.py puts
# the longest files first. TRACEKIT_TEST_WORKERS=0 runs serially.
# Two passes: the suite (all but the files marked `long`), then the long set (minutes of multi-process runs
# each); the command fails when either fails. With pytest args it runs one pass with them, nothing left out
# (`./scripts/test.sh -m "not long"`: the suite alone; `./scripts/test.sh tests/parse -x`: those files).
run() {
    .venv/bin/python -m pytest -q -rsx -p no:cacheprovider -n "${TRACEKIT_TEST_WORKERS:-2}" --dist loadfile \
        --no-loadscope-reorder --durations=25 "$@"
}
if [ $# -gt 0 ]; then
    run "$@"
    exit
fi
rc=0
echo "[test] pass 1 of 2: the suite (-m 'not long')" >&2
SECONDS=0
run -m "not long" || rc=$?
echo "[test] pass 1 took ${SECONDS}s; pass 2 of 2: the long set (-m long)" >&2
SECONDS=0
run -m long || rc=$?
echo "[test] pass 2 took ${SECONDS}s" >&2
exit "$rc"
