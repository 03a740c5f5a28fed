#!/usr/bin/env bash
# The test command: sets up .venv if needed, then runs the whole suite (pytest args pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install_chromium.sh
export TRACEKIT_SHARED_TRACES=${TRACEKIT_SHARED_TRACES:-$(cd .. && pwd)/shared/traces}
# Two xdist workers (the target box has 2 cores); whole files go to one worker (--dist loadfile) so a
# file's module/session fixtures (e.g. the detection matrix's runtime runs) are built once, in collection
# order (--no-loadscope-reorder; xdist would sort files by their number of tests): tests/conftest.py puts
# the longest files first. TRACEKIT_TEST_WORKERS=0 runs serially.
# The files marked `long` (minutes of multi-process runs each) are left out (-m "not long"): CI runs them
# after the rest (.ci/run: scripts/test.sh -m long); a -m of your own replaces this one (-m "" runs all).
exec .venv/bin/python -m pytest -q -rsx -p no:cacheprovider -n "${TRACEKIT_TEST_WORKERS:-2}" --dist loadfile \
    --no-loadscope-reorder --durations=25 -m "not long" "$@"
