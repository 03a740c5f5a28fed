#!/usr/bin/env bash
# The test command: sets up .venv if needed, then runs the whole suite (pytest args pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install_chromium.sh
export TRACEKIT_SHARED_TRACES=${TRACEKIT_SHARED_TRACES:-$(cd .. && pwd)/shared/traces}
exec .venv/bin/python -m pytest -q -rsx -p no:cacheprovider "$@"
