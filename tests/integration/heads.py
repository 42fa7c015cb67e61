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
