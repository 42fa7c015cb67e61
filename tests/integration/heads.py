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



def trained_eagle3_head(target: str, work: Path) -> tuple[str, dict]:
    """A head trained by the user's command, `train-eagle3`, on `target`'s answers to four
    prompts (one held out), 16 tokens each, one epoch: every stage runs (a plain server for the
    answers, the captured layers, training, the held-out score and a score on two more questions,
    the export). Returns the head's directory and its provenance."""
    import json
    import subprocess
    import sys

    prompts = work / "prompts.jsonl"
    rows = ["Explain what a list is in Python.", "How do I open a file?", "What is a loop?", "What is a function?"]
    prompts.write_text("".join(json.dumps({"id": i, "split": "heldout" if i == 3 else "train", "prompt": p}) + "\n"
                               for i, p in enumerate(rows)))  # fmt: skip
    questions = work / "questions.jsonl"  # another set to score on, answered by the same server
    questions.write_text('{"question": "Name three sorting algorithms."}\n{"question": "What is a tuple?"}\n')
    cmd = [sys.executable, "-m", "sglang_specsot.models", "train-eagle3", target, "--work", str(work / "work"),
           "--out", str(work / "head"), "--prompts", str(prompts), "--max-tokens", "16", "--epochs", "1",
           "--accumulate", "2", "--draft-vocab", "4096", "--concurrency", "4", "--score-on", str(questions)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    head = out.stdout.strip().splitlines()[-1]
    return head, json.loads(Path(head, "provenance.json").read_text())
