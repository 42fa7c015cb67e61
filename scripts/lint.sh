#!/usr/bin/env bash
# Lint with the pinned ruff (requirements/dev.lock; rules in pyproject.toml's [tool.ruff]):
# pyflakes (F) and syntax errors (E9) on the package, tests, examples and scripts.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/ruff check sglang_specsot tests examples scripts "$@"
