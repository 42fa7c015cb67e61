"""A draft model cut from its target: the first K decoder layers, the same embeddings and head.

SmolLM2-135M has no smaller model with its tokenizer, and tests want a draft for
Qwen2.5-Coder-0.5B that is cheap and disagrees with it now and then. Keeping the first layers
(plus the final norm and the LM head) gives a model with exactly the target's vocabulary that
predicts the target's next token much of the time: a self-speculative ("layer-skip") draft.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
# Everything but the weights: tokenizer, chat template, generation config.
_KEEP_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
               "special_tokens_map.json", "vocab.json", "merges.txt")  # fmt: skip


def _weight_files(src: Path) -> list[Path]:
    index = src / "model.safetensors.index.json"
    if index.is_file():
        return sorted({src / f for f in json.loads(index.read_text())["weight_map"].values()})
    single = src / "model.safetensors"
    if not single.is_file():
        raise ValueError(f"{src} holds no safetensors weights (model.safetensors or an index)")
    return [single]


def truncate_model(src: str | Path, out: str | Path, num_layers: int) -> Path:
    """Write `out`: `src` with only its first `num_layers` decoder layers. Returns `out`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, out = Path(src), Path(out)
    config = json.loads((src / "config.json").read_text())
    total = config.get("num_hidden_layers")
    if not isinstance(total, int) or not 1 <= num_layers < total:
        raise ValueError(f"--layers must be 1..{total - 1 if isinstance(total, int) else '?'} for {src}, got {num_layers}")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty; choose a new directory")
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for file in _weight_files(src):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                layer = _LAYER.match(name)
                if layer is None or int(layer.group(1)) < num_layers:
                    tensors[name] = f.get_tensor(name)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config["num_hidden_layers"] = num_layers
    for key in ("layer_types", "max_window_layers"):  # per-layer settings follow the cut
        if isinstance(config.get(key), list):
            config[key] = config[key][:num_layers]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in _KEEP_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    return out
