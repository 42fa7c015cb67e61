"""The features stage reuses a shard only when it holds exactly the answers now in its place."""

import torch
import transformers

from sglang_specsot.models.eagle3 import features


def answer(i: int, text: list[int]) -> dict:
    return {"id": i, "split": "train", "prompt_ids": [1, 2], "answer_ids": text}


def captured(monkeypatch) -> list[int]:
    """Stub the target: every captured sequence's id is recorded; returns that record."""
    seen = []

    def one(model, row, aux_ids):
        seen.append(row["id"])
        return {"id": row["id"], "split": row["split"], "ids": torch.tensor(row["prompt_ids"] + row["answer_ids"])}

    monkeypatch.setattr(features, "SHARD", 2)
    monkeypatch.setattr(features, "_one", one)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: torch.nn.Identity())
    return seen


def test_shards_are_captured_again_only_where_the_answers_changed(tmp_path, monkeypatch):
    seen = captured(monkeypatch)
    rows = [answer(i, [10 + i, 11]) for i in range(5)]
    paths = features.write_features("target", rows, tmp_path, (1, 2, 3))
    assert [p.name for p in paths] == ["shard-00000.pt", "shard-00001.pt", "shard-00002.pt"] and seen == [0, 1, 2, 3, 4]

    seen.clear()
    assert features.write_features("target", rows, tmp_path, (1, 2, 3)) == paths and seen == []  # all current
    rows[3] = answer(3, [99])  # an answer regenerated: its shard only
    features.write_features("target", rows, tmp_path, (1, 2, 3))
    assert seen == [2, 3]

    seen.clear()
    cut = features.write_features("target", rows[:3], tmp_path, (1, 2, 3))  # fewer answers (--limit)
    assert [p.name for p in cut] == ["shard-00000.pt", "shard-00001.pt"] and seen == [2]
    assert [s["id"] for s in features.load_features(cut)] == [0, 1, 2]
