#!/usr/bin/env bash
# Debian's headless Chromium for the report test (tests skip the browser check if this fails).
set -uo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "[setup] not root: cannot apt-get install chromium" >&2; exit 0; fi
echo "[setup] installing Debian chromium (for the report test)" >&2
(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
  || echo "[setup] chromium install failed; the browser test will be skipped" >&2
