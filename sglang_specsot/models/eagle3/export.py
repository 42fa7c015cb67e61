"""A trained head as SGLang loads it: `config.json`, `model.safetensors` (bf16, the
`midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d` names SpecForge writes and
`LlamaForCausalLMEagle3.load_weights` reads), the target's tokenizer, and `provenance.json`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from sglang_specsot.models.eagle3.head import Eagle3Head

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                   "special_tokens_map.json", "chat_template.jinja")  # fmt: skip
REQUIRED = ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d")


def serving_state(head: Eagle3Head) -> dict[str, torch.Tensor]:
    """Weights in bf16 (the dtype the head is served in); the vocabulary maps as they are."""
    state = {}
    for name, value in head.state_dict().items():
        state[name] = value.to(torch.bfloat16).contiguous() if value.is_floating_point() else value.contiguous()
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise ValueError(f"the head lacks {missing}; SGLang would load it without them silently")
    return state


def export_head(head: Eagle3Head, target: str, out: Path, provenance: dict) -> Path:
    """Write the head directory whole, then move it into place (a reader never sees half)."""
    from safetensors.torch import save_file

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(head.shape.sglang_config(), indent=2) + "\n")
    save_file(serving_state(head), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        if Path(target, name).exists():
            shutil.copy(Path(target, name), tmp / name)
    (tmp / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
