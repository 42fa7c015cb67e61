"""Installs the stand-ins of scripts/own_capture_twin.py in every process of its engine.

Python imports `sitecustomize` at start-up from the first folder on sys.path that has one; only
the twin puts this folder there (with SPECSOT_OWN_CAPTURE_TWIN=1), so the engine's scheduler
installs the stand-ins before it imports SGLang.
"""

from __future__ import annotations

import os

if os.environ.get("SPECSOT_OWN_CAPTURE_TWIN") == "1":
    import own_capture_stand_ins

    own_capture_stand_ins.install()
