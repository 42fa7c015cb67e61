#!/usr/bin/env bash
# Create .venv in the repo root from the checked-in locks; idempotent and quick when done.
#
#   CPU host (default): the lean route — sglang==0.5.23 plus only what it imports at run time
#     on the CPU path, exact pins, `pip install --no-deps` (a plain install would pull the
#     CUDA-only sglang-kernel, and `pip install torchvision` alone silently swaps torch).
#   CUDA host (SPECSOT_SETUP=cuda): the normal `pip install sglang==0.5.23` route; needs a
#     working NVIDIA driver (see the README for what is verified where).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE="${SPECSOT_SETUP:-cpu}"
VENV=.venv
PY="${PYTHON:-python3.11}"

die() { echo "setup: $*" >&2; exit 1; }

command -v "$PY" >/dev/null 2>&1 || die "needs Python 3.11 ($PY not found); set PYTHON=/path/to/python3.11"
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || die "$PY is not Python 3.11"

case "$MODE" in
  cpu) LOCKS=(requirements/cpu.lock requirements/dev.lock) ;;
  cuda)
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1 \
      || die "SPECSOT_SETUP=cuda asks for the CUDA route, but this host has no working NVIDIA driver (nvidia-smi); use the default CPU route"
    LOCKS=(requirements/cuda.txt requirements/dev.lock) ;;
  *) die "SPECSOT_SETUP must be 'cpu' or 'cuda', got '$MODE'" ;;
esac

# The stamp covers everything that decides the venv's content; equal stamp = nothing to do.
stamp=$(cat "${LOCKS[@]}" pyproject.toml sglang_specsot_bootstrap.pth | sha256sum | cut -c1-16)
stamp_file="$VENV/.specsot-setup-$MODE"
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] && [ -x "$VENV/bin/python" ]; then
  echo "setup: $VENV is up to date ($MODE, $stamp)" >&2
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# pip's download cache (~/.cache/pip) keeps wheels between runs; wheels are pinned exactly.
# A pip config that names extra local indexes which do not exist makes pip warn per link;
# hide that noise.
pipq() {
  local rc
  "$VENV/bin/python" -m pip -q "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || die "pip $* failed (exit $rc)"
}

echo "setup: installing ${LOCKS[*]} into $VENV (first time: several minutes)" >&2
if [ "$MODE" = cpu ]; then
  pipq install --no-deps -r requirements/cpu.lock -r requirements/dev.lock
else
  pipq install -r requirements/cuda.txt
  pipq install --no-deps -r requirements/dev.lock
fi
pipq install --no-deps --no-build-isolation -e .

# Fail here, not in a test: everything pinned must import, and the plugin must be visible.
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md, sys
need = {"sglang": "0.5.23"}
for name, want in need.items():
    got = md.version(name)
    if got != want:
        sys.exit(f"setup: {name}=={got} installed, {want} required")
eps = [ep.value for ep in md.entry_points(group="sglang.srt.plugins") if ep.name == "specsot"]
if eps != ["sglang_specsot.plugin:register"]:
    sys.exit(f"setup: the sglang.srt.plugins entry point is missing or wrong: {eps}")
import sglang, torch, transformers  # noqa: F401
EOF
echo "$stamp" > "$stamp_file"
echo "setup: done ($MODE, $stamp)" >&2
