"""SGLang's EAGLE and EAGLE3 start and decode on this CPU through `specsot_cpu`.

No trained EAGLE head exists for any model we can fetch, so the draft is a one-layer head with
dummy (random) weights on the tiny random Llama: acceptance is near 1, but the whole EAGLE
machinery (multi-step draft decode with top-k 2, tree verify, draft-extend) runs, and greedy
output must still equal plain decoding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_specsot.launch import ServerProcess
from tests.integration.conftest import cpu_args
from tests.integration.heads import head_dir

pytestmark = [pytest.mark.integration, pytest.mark.long]

COMMON = cpu_args(mem_fraction_static=0.2)
PROMPTS = ["The quick brown fox", "Once upon a time", "How can I improve my time management skills?"]
MAX_NEW = 24


def _generate(server: ServerProcess) -> list[dict]:
    return server.post("/generate", {"text": PROMPTS, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW}})


@pytest.fixture(scope="module")
def plain(tiny_model_path) -> list[list[int]]:
    with ServerProcess(tiny_model_path, COMMON) as server:
        return [o["output_ids"] for o in _generate(server)]


@pytest.mark.parametrize(
    ("algo", "architecture", "extra", "topk"),
    [
        ("EAGLE", "LlamaForCausalLMEagle", {}, 2),
        ("EAGLE3", "LlamaForCausalLMEagle3", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}, 1),
    ],
)
def test_eagle_family_decodes_like_plain(algo, architecture, extra, topk, tiny_model_path, plain, tmp_path):
    if algo == "EAGLE3":
        extra = {**extra, "draft_vocab_size": json.loads(Path(tiny_model_path, "config.json").read_text())["vocab_size"]}
    draft = head_dir(tiny_model_path, tmp_path / "draft", architecture, **extra)
    args = COMMON + [
        "--speculative-algorithm", algo, "--speculative-draft-model-path", draft,
        "--speculative-draft-load-format", "dummy", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", "4",
    ]  # fmt: skip
    with ServerProcess(tiny_model_path, args) as server:
        out = _generate(server)
    assert [o["output_ids"] for o in out] == plain
    # Every request went through draft + verify (SGLang counts verify steps per request).
    assert all(o["meta_info"].get("spec_verify_ct", 0) > 0 for o in out), [o["meta_info"] for o in out]
