"""A draft whose vocabulary is a prefix of the target's, served on this CPU: a random-weight
target with Qwen2.5-7B's 152,064 rows and a draft cut from it to Qwen2.5-0.5B's 151,936, on
one tokenizer, launches and keeps plain decoding's greedy output.

Proves the launch check (algorithm.py) and the worker's (drafters/model.py: sizes, then the
loaded tokenizers on the shared ids) accept the pair, and that the draft model drafts for the
target through SGLang's standalone draft worker: the draft is the target's first rows, so its
drafts are accepted. Long tier: two server starts and parity cost about 2 minutes on the
EPYC-AVX2; the default tier checks the same rules without a server
(tests/unit/speculative/test_vocab_prefix.py) and a larger draft refused at launch
(tests/integration/test_specsot_draft_model.py).
"""

from __future__ import annotations

import pytest

from sglang_specsot.models.tiny import build_tiny_model, cut_vocabulary
from tests.integration.conftest import FIXED_WINDOW_ENV, cpu_args, leak_checked_server
from tests.integration.parity import mismatches, plain_reference, run_batches

pytestmark = [pytest.mark.integration, pytest.mark.long]

QWEN25_7B, QWEN25_05B = 152064, 151936
MAX_NEW = 12
QUESTIONS = 4  # and 4 branch prompts: 8 prompts in batches of 1, 2, 3 and 2
ARGS = cpu_args(max_total_tokens=4096, mem_fraction_static=0.3)
SPECSOT = ["--speculative-algorithm", "SPECSOT", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "6"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    """(target, draft): a 2-layer random target with the 7B's rows, the draft its first 151,936."""
    root = tmp_path_factory.mktemp("vocab-prefix")
    target = build_tiny_model(root / "target", vocab_size=QWEN25_7B, num_layers=2, hidden_size=64, seed=3)
    return str(target), str(cut_vocabulary(target, root / "draft", QWEN25_05B))


def test_vocab_prefix_pair_launches_and_keeps_greedy_parity(pair, tmp_path):
    target, draft = pair
    prompts, plain_ids = plain_reference(target, ARGS, MAX_NEW, QUESTIONS)
    args = ARGS + SPECSOT + ["--speculative-draft-model-path", draft]
    with leak_checked_server(target, args, tmp_path / "server.log", env=FIXED_WINDOW_ENV) as server:
        results = run_batches(server, prompts, MAX_NEW)
        bad = mismatches(results, plain_ids)
        assert not bad, f"SPECSOT with a prefix-vocabulary draft differs from plain decoding on prompts {bad}"
        accept = [r["meta_info"]["spec_accept_length"] for r in results]
        assert sum(accept) / len(accept) > 1.5, accept  # the draft is the target on its rows
        log = server.log_path.read_text()
        assert f"SPECSOT draft vocabulary: the first {QWEN25_05B} of the target's {QWEN25_7B} ids" in log
