"""EAGLE head directories for tests: a head's config beside the target's tokenizer.

No trained head exists for any model we can fetch, so a test's head is randomly initialised
(`--speculative-draft-load-format dummy`): its drafts are rarely accepted, but every stage of
SGLang's EAGLE machinery runs over the target's real hidden states.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json")


def head_dir(target: str, out: Path, architecture: str, **extra) -> str:
    """A one-layer head of `architecture` for `target` (its sizes, its tokenizer), in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads(Path(target, "config.json").read_text())
    # A head's LM head is its own or the target's, never its embedding (which is the target's).
    config.update({"architectures": [architecture], "num_hidden_layers": 1, "tie_word_embeddings": False, **extra})
    (out / "config.json").write_text(json.dumps(config))
    for name in TOKENIZER_FILES:
        if Path(target, name).exists():
            shutil.copy(Path(target, name), out / name)
    return str(out)


def eagle3_head_dir(target: str, out: Path, **extra) -> str:
    """An EAGLE-3 head reading three of the target's layers (early, middle, late), with a draft
    vocabulary of the target's size (its own LM head), as SpecForge lays out a head's config."""
    config = json.loads(Path(target, "config.json").read_text())
    layers = config["num_hidden_layers"]
    aux = {"eagle_aux_hidden_state_layer_ids": [1, layers // 2, layers - 4]}
    fields = {"eagle_config": aux, "draft_vocab_size": config["vocab_size"], **extra}
    return head_dir(target, out, "LlamaForCausalLMEagle3", **fields)


def exported_eagle3_head(target: str, out: Path, draft_vocab: int = 4096) -> str:
    """An untrained EAGLE-3 head for `target` as `train-eagle3` writes one (its weights in
    safetensors, a reduced draft vocabulary, the target's tokenizer), so SGLang loads it with
    its real loader: the export's names, dtypes and vocabulary maps go through the server."""
    import torch

    from sglang_specsot.models.eagle3.export import export_head
    from sglang_specsot.models.eagle3.head import HeadShape
    from sglang_specsot.models.eagle3.pipeline import target_config, target_parts
    from sglang_specsot.models.eagle3.train import init_head

    config = target_config(target)
    vocab = torch.arange(draft_vocab)  # the lowest ids: a stand-in for the most frequent ones
    parts = target_parts(target, vocab, int(config["num_hidden_layers"]))
    head = init_head(HeadShape.from_target(config, draft_vocab), vocab, parts, seed=0)
    return str(export_head(head, target, out, {"untrained": True}))
