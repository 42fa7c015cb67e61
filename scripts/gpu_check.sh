#!/usr/bin/env bash
# The prepared device check: one NVIDIA GPU with torch, triton and transformers, no network, no
# SGLang. Details and stages: scripts/gpu_check.py (--help).
#
#   scripts/gpu_check.sh --prepare     here, with network: fetch the wheels into .gpu-carry/ and
#                                      print the carry with the tree (fails over 64 MiB)
#   scripts/gpu_check.sh --cpu-smoke   here: the stages' code paths on the CPU, small shapes
#   scripts/gpu_check.sh               on the GPU machine, with .gpu-carry carried: install the
#                                      wheels, run the stages; JSON lines in $OUT/gpu_check.jsonl
set -uo pipefail
cd "$(dirname "$0")/.."

here_python() { if [ -x .venv/bin/python ]; then echo .venv/bin/python; else echo python3; fi; }

case "${1:-}" in
  -h|--help) exec "$(here_python)" scripts/gpu_check.py --help ;;
  --prepare) exec "$(here_python)" scripts/gpu_check.py prepare ;;
  --size) exec "$(here_python)" scripts/gpu_check.py size ;;
  --cpu-smoke) exec "$(here_python)" scripts/gpu_check.py cpu-smoke ;;
  "") ;;
  *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

OUT="${OUT:-/tmp/specsot-gpu-check/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# The whole run stays under 7 minutes; the stages share a budget inside this one.
timeout -k 10 420 "${PYTHON:-python3}" scripts/gpu_check.py run --out "$OUT" 2>&1 | tee -a "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
