"""What `--speculative-draft-model-path` names: a draft model, or an EAGLE head.

SGLang's users choose EAGLE-3 with `--speculative-algorithm EAGLE3`; SPECSOT takes one
algorithm name for every drafter, so it reads the kind from the draft's `config.json`
architectures, the names SGLang loads the draft by (`LlamaForCausalLMEagle3`,
`LlamaForCausalLMEagle`, ...). Plain Python: the launcher reads it before SGLang's config
bags exist, and every scheduler process reads it again (cached per path).
"""

from __future__ import annotations

import enum
import functools
import json
from pathlib import Path


class DraftKind(enum.Enum):
    """How the draft proposes, and what it reads from the target."""

    MODEL = "model"  # a whole LM with its own embedding and head (SGLang's STANDALONE draft)
    EAGLE = "eagle"  # an EAGLE(-2) head: the target's last hidden state and embedding
    EAGLE3 = "eagle3"  # an EAGLE-3 head: the target's aux-layer hidden states, concatenated

    @property
    def is_head(self) -> bool:
        """Whether its draft-extend reads the target's hidden states of the same step."""
        return self is not DraftKind.MODEL


def config_of(path: str) -> dict | None:
    """The draft's config.json, or None where the path has none (a hub id, a GGUF file)."""
    config = Path(path, "config.json")
    return json.loads(config.read_text()) if config.is_file() else None


@functools.lru_cache(maxsize=8)
def draft_kind(path: str) -> DraftKind:
    """The kind of the draft at `path`, from its architectures; a draft model where none say Eagle."""
    config = config_of(path) or {}
    return kind_of_architectures(config.get("architectures") or [])


def kind_of_architectures(architectures: list[str]) -> DraftKind:
    if any("Eagle3" in a for a in architectures):
        return DraftKind.EAGLE3
    if any("Eagle" in a for a in architectures):
        return DraftKind.EAGLE
    return DraftKind.MODEL


def head_mismatch(target: dict, head: dict, kind: DraftKind) -> str | None:
    """Why an EAGLE head cannot draft for the target (configs as read from config.json), or None.

    A head embeds tokens with the target's embedding and reads the target's hidden states:
    its vocabulary and its hidden size must be the target's (an EAGLE-3 head's `fc` takes
    `target_hidden_size` x aux layers, `target_hidden_size` defaulting to its own hidden size).
    An EAGLE-3 head's aux layer ids must be layers whose output the target can capture:
    SGLang captures layer i's output as the input of layer i + 1 (llama.py:939-941), so the
    last layer's id would be silently missing from the concatenation.
    """
    t_vocab, h_vocab = vocab_size(target), vocab_size(head)
    if t_vocab is not None and h_vocab is not None and t_vocab != h_vocab:
        return f"its vocab_size is {h_vocab} and the target's is {t_vocab}"
    t_hidden = _text(target).get("hidden_size")
    h_hidden = head.get("target_hidden_size") or head.get("hidden_size")
    if t_hidden is not None and h_hidden is not None and t_hidden != h_hidden:
        return f"it reads hidden states of size {h_hidden} and the target's hidden_size is {t_hidden}"
    layers = _text(target).get("num_hidden_layers")
    aux = (head.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or []
    if kind is DraftKind.EAGLE3 and layers is not None and any(not 0 <= i < layers - 1 for i in aux):
        return f"its eagle_aux_hidden_state_layer_ids {aux} are not all within 0..{layers - 2} (the target has {layers} layers)"
    return None


def vocab_size(config: dict) -> int | None:
    """A config's vocabulary size: its own, or its text part's (a multimodal config)."""
    return config.get("vocab_size") or _text(config).get("vocab_size")


def _text(config: dict) -> dict:
    """A multimodal config's text part, where the sizes live; else the config itself."""
    return config.get("text_config") or config
