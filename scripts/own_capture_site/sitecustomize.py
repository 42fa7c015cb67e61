"""Installs the stand-ins of scripts/own_capture_twin.py in every process of its engine.

Python imports `sitecustomize` at start-up from the first folder on sys.path that has one; only
the twin (SPECSOT_OWN_CAPTURE_TWIN=1: the CPU stand-ins and the test drafter mode; =cuda: the
test drafter mode alone, on a GPU) and the device check's sync counter (SPECSOT_SYNC_LOG,
scripts/gpu_sync_count.py) put this folder there, so the engine's scheduler installs what they
ask for before it imports SGLang.
"""

from __future__ import annotations

import os

if os.environ.get("SPECSOT_OWN_CAPTURE_TWIN") in ("1", "cuda") or os.environ.get("SPECSOT_SYNC_LOG"):
    import own_capture_stand_ins

    own_capture_stand_ins.install()
