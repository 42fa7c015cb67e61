"""Teacher, chain scoring, training (deterministic, resumable) and export, on a small head
and synthetic features (no model needed)."""

import json

import pytest
import torch

from sglang_specsot.models.eagle3.evaluate import context_score, score
from sglang_specsot.models.eagle3.export import export_head, serving_state
from sglang_specsot.models.eagle3.head import HeadShape
from sglang_specsot.models.eagle3.pipeline import Plan, draft_vocabulary, question_prompts
from sglang_specsot.models.eagle3.teacher import Teacher, chain_hits, shifted, step_inputs, teacher, walk
from sglang_specsot.models.eagle3.train import TargetParts, TrainConfig, init_head, lr_at, train

H, V, DV = 16, 40, 24
CONFIG = {"num_hidden_layers": 8, "vocab_size": V, "hidden_size": H, "intermediate_size": 24,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 10000.0}  # fmt: skip


def parts(vocab) -> TargetParts:
    g = torch.Generator().manual_seed(1)
    head = torch.randn(V, H, generator=g)
    mlp = {"gate_proj": torch.randn(24, H, generator=g) * 0.1, "up_proj": torch.randn(24, H, generator=g) * 0.1,
           "down_proj": torch.randn(H, 24, generator=g) * 0.1}  # fmt: skip
    return TargetParts(torch.randn(V, H, generator=g), head[vocab].clone(), torch.ones(H), mlp)


def sequence(seed: int, t: int = 12, start: int = 4, split: str = "train") -> dict:
    """A sequence whose 'target' repeats a short cycle: learnable from the features."""
    g = torch.Generator().manual_seed(seed)
    ids = (torch.arange(t) * 3 + seed) % DV * (V // DV)
    aux = torch.randn(t, 3 * H, generator=g) * 0.1
    aux[:, :DV] += torch.nn.functional.one_hot(ids % DV, DV).float()
    final = torch.randn(t, H, generator=g)
    return {"id": seed, "split": split, "ids": ids.to(torch.int32), "start": start,
            "aux": aux.to(torch.bfloat16), "final": final.to(torch.bfloat16), "greedy": torch.roll(ids, -1).to(torch.int32)}  # fmt: skip


def test_shifted_and_step_inputs():
    x = torch.arange(6)
    assert shifted(x, 0, 6, -1).tolist() == [1, 2, 3, 4, 5, -1]
    assert shifted(x, 2, 6, -1).tolist() == [3, 4, 5, -1, -1, -1]
    seq = {"ids": torch.tensor([5, 6, 7, 8])}
    assert step_inputs(seq, 3).tolist() == [[6, 7, 8, 0, 0, 0]]


def test_walk_steps_through_an_answer_as_greedy_decoding_does():
    # answer starts at 3 in 10 tokens; first base 2; bases keep 2, then 0, then 3, ...
    hits = torch.tensor([0, 0, 2, 0, 0, 0, 3, 0, 0, 0])
    tokens, steps = walk(hits, 3, 10)
    # base 2 -> +3 (p=5), base 5 -> +1 (p=6), base 6 -> +4 (p=10): 8 tokens, 3 verifies
    assert (tokens, steps) == (8, 3)
    assert walk(torch.zeros(10, dtype=torch.long), 3, 10) == (6, 6)


def test_chain_hits_stop_at_the_first_miss_and_the_end():
    greedy = torch.tensor([1, 2, 3, 4, 5, 6])
    t = Teacher(torch.zeros(6, 4), greedy, torch.ones(6, dtype=torch.bool))
    target_ids = torch.arange(10)
    onehot = lambda rows: torch.nn.functional.one_hot(torch.tensor(rows), 10).float()  # noqa: E731
    # base i step k is right when it proposes greedy[i + k + 1]
    step0 = onehot([2, 3, 0, 5, 6, 0])
    step1 = onehot([3, 0, 5, 6, 0, 0])
    hits = chain_hits([step0, step1], t, target_ids)
    assert hits.tolist() == [2, 1, 0, 1, 0, 0]  # base 3's second draft would be past the end


def test_teacher_counts_answer_positions_the_head_can_propose():
    seq = sequence(0)
    vocab = torch.arange(DV)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[vocab] = True
    seq["greedy"][6] = V - 1  # a token outside the draft vocabulary
    t = teacher(seq, torch.randn(DV, H), t2d)
    assert t.valid.tolist() == [j + 1 >= 4 and j + 1 < 12 and j != 6 for j in range(12)]
    torch.testing.assert_close(t.probs.sum(-1), torch.ones(12))


def test_training_learns_and_resumes_to_the_same_weights(tmp_path):
    vocab = torch.arange(0, V, V // DV)[:DV]
    shape = HeadShape.from_target(CONFIG, DV)
    p = parts(vocab)
    seqs = [sequence(s) for s in range(8)]
    cfg = TrainConfig(steps=3, epochs=2, lr=3e-3, accumulate=2, checkpoint_every=3, seed=7)
    straight = train(init_head(shape, vocab, p, cfg.seed), seqs, p, cfg, tmp_path / "a")
    log = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)["state"]["log"]
    assert len(log) == 8 and log[-1]["loss"] < log[0]["loss"]

    # stop after 3 updates (a checkpoint), then resume: the same weights at the end
    class Stop(Exception):
        pass

    def stop_at(done, total, row):
        if done == 4:
            raise Stop

    with pytest.raises(Stop):
        train(init_head(shape, vocab, p, cfg.seed), seqs, p, cfg, tmp_path / "b", stop_at)
    resumed = train(init_head(shape, vocab, p, cfg.seed), seqs, p, cfg, tmp_path / "b")
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)

    with pytest.raises(ValueError, match="same settings"):
        train(init_head(shape, vocab, p, cfg.seed), seqs, p, TrainConfig(steps=3, epochs=3), tmp_path / "b")
    other = torch.cat([vocab[:-1], torch.tensor([V - 1])])  # another draft vocabulary, same size
    with pytest.raises(ValueError, match="another draft vocabulary"):
        train(init_head(shape, other, parts(other), cfg.seed), seqs, p, cfg, tmp_path / "b")


def test_score_and_export(tmp_path):
    vocab = torch.arange(0, V, V // DV)[:DV]
    shape = HeadShape.from_target(CONFIG, DV)
    p = parts(vocab)
    head = init_head(shape, vocab, p, 0)
    result = score(head, [sequence(9, split="heldout")], p.embed, p.head_rows, 3)
    assert result.verifies > 0 and 1.0 <= result.accept_length <= 4.0 and len(result.step_acc) == 3
    with pytest.raises(ValueError, match="no held-out"):
        score(head, [], p.embed, p.head_rows, 3)

    state = serving_state(head)
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.self_attn.q_proj.weight",
            "midlayer.hidden_norm.weight", "midlayer.mlp.down_proj.weight"} <= set(state)  # fmt: skip
    assert state["fc.weight"].dtype == torch.bfloat16 and state["d2t"].dtype == torch.long
    assert state["midlayer.self_attn.q_proj.weight"].shape == (16, 2 * H)  # reads embed + hidden
    target = tmp_path / "target"
    target.mkdir()
    (target / "tokenizer.json").write_text("{}")
    out = export_head(head, str(target), tmp_path / "head", {"seed": 0})
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and (out / "tokenizer.json").exists()
    assert not (tmp_path / "head.tmp").exists()


def test_context_score_replays_the_context_drafter_over_answers():
    fresh = {"prompt_ids": [1, 2], "answer_ids": list(range(100, 140))}  # nothing repeats: no draft right
    assert context_score([fresh], 4) == 1.0
    cycle = {"prompt_ids": [1, 2], "answer_ids": [10, 11, 12, 13, 14] * 8}  # predictable after one cycle
    assert 3.0 < context_score([cycle], 4) <= 5.0
    again = {"prompt_ids": [3], "answer_ids": list(range(100, 140))}  # the first answer again
    assert context_score([fresh, again], 4) == 1.0  # each answer alone
    assert context_score([fresh, again], 4, shared=True) > 1.5  # the first in the corpus
    with pytest.raises(ValueError, match="no held-out"):
        context_score([], 4)


def test_draft_vocabulary_ranks_by_frequency_and_keeps_end_ids():
    answers = [{"split": "train", "answer_ids": [5, 5, 5, 7, 7, 2]}, {"split": "heldout", "answer_ids": [9] * 50}]
    assert draft_vocabulary(answers, 3, 20, [19]).tolist() == [5, 7, 19]
    assert draft_vocabulary(answers, 5, 20, [19]).tolist() == [0, 2, 5, 7, 19]  # filled from the lowest ids
    with pytest.raises(ValueError, match="--draft-vocab 30"):
        draft_vocabulary(answers, 30, 20, [])


def test_question_sets_to_score_on_must_be_held_out(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "What is rope?"}\n{"question": "Name three rivers."}\n')
    rows = question_prompts(str(path), [{"id": 0, "prompt": "Explain tides.", "split": "train"}])
    assert rows == [{"id": 0, "prompt": "What is rope?", "split": "heldout"},
                    {"id": 1, "prompt": "Name three rivers.", "split": "heldout"}]  # fmt: skip
    with pytest.raises(ValueError, match="1 of its questions are in the prompt set"):
        question_prompts(str(path), [{"id": 3, "prompt": " Name three rivers.", "split": "train"}])
    with pytest.raises(ValueError, match="unknown question set 'nope'"):
        question_prompts("nope", [])
    with pytest.raises(ValueError, match="need different file names"):
        Plan("t", tmp_path, tmp_path, score_on=("a/q.jsonl", "b/q.jsonl"))


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="steps=0"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="lr=0"):
        TrainConfig(lr=0)
    cfg = TrainConfig(lr=1.0, warmup=0.1)
    assert lr_at(0, 100, cfg) == pytest.approx(0.1) and lr_at(100, 100, cfg) == pytest.approx(0.1)
    assert lr_at(10, 100, cfg) == pytest.approx(1.0)
