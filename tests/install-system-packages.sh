#!/usr/bin/env bash
# Debian packages some tests use: PostgreSQL (the DuckLake catalog) and Chromium (the HTML report).
# Installs only what is missing; without root it says what is missing and those tests skip.
set -euo pipefail
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "not root: cannot install ${missing[*]}; the tests that need them will be skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
  echo "could not install ${missing[*]}; the tests that need them will be skipped" >&2
fi
