"""`python -m sglang_specsot.models train-eagle3 TARGET`: answers, features, vocabulary,
training, held-out score, export. Every stage keeps its output in the work directory and is
skipped when done, so the command is rerun to resume after a stop at any point (or, once
trained, to score the head on more question sets with `score_on`)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from sglang_specsot.data import load_questions
from sglang_specsot.models.eagle3.answers import write_answers
from sglang_specsot.models.eagle3.evaluate import context_score, score
from sglang_specsot.models.eagle3.export import export_head
from sglang_specsot.models.eagle3.features import load_features, write_features
from sglang_specsot.models.eagle3.head import HeadShape
from sglang_specsot.models.eagle3.store import read_rows
from sglang_specsot.models.eagle3.train import TargetParts, TrainConfig, init_head, train

logger = logging.getLogger(__name__)

PROMPTS = Path(__file__).resolve().parents[2] / "data" / "eagle3_prompts.jsonl"
ANSWERS = "answers.jsonl"


@dataclass(frozen=True)
class Plan:
    target: str  # the target's checkpoint directory
    work: Path
    out: Path
    prompts: Path = PROMPTS
    limit: int | None = None  # the first N prompts only (a quick look)
    max_tokens: int = 384
    concurrency: int = 48
    draft_vocab: int = 8192
    train: TrainConfig = TrainConfig()
    # Question sets (names or .jsonl paths) the trained head is also scored on, beside the
    # context drafter: the target's answers to questions from another hand than the prompts'.
    score_on: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        stems = [Path(name).stem for name in self.score_on]
        if len(set(stems)) < len(stems):
            raise ValueError(f"--score-on {' '.join(self.score_on)}: each set keeps its answers in "
                             f"<work>/score-NAME, so the sets need different file names, got {stems}")  # fmt: skip


def target_config(target: str) -> dict:
    path = Path(target, "config.json")
    if not path.exists():
        raise ValueError(f"{target} has no config.json; TARGET is a fetched model's name or a checkpoint directory")
    return json.loads(path.read_text())


def target_parts(target: str, vocab: torch.Tensor, layers: int) -> TargetParts:
    """The target's embedding, LM head rows of `vocab`, final norm and last MLP, read from
    its safetensors (the whole model is not loaded)."""
    from safetensors import safe_open

    tensors = {}
    for f in sorted(Path(target).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():
                tensors[key] = (f, key)

    def get(key: str) -> torch.Tensor:
        f, k = tensors[key]
        with safe_open(str(f), "pt") as st:
            return st.get_tensor(k)

    embed = get("model.embed_tokens.weight")
    lm_head = get("lm_head.weight") if "lm_head.weight" in tensors else embed
    last = f"model.layers.{layers - 1}.mlp"
    mlp = {name: get(f"{last}.{name}.weight") for name in ("gate_proj", "up_proj", "down_proj")}
    return TargetParts(embed, lm_head[vocab].clone(), get("model.norm.weight"), mlp)


def draft_vocabulary(answers: list[dict], size: int, vocab_size: int, always: list[int]) -> torch.Tensor:
    """The `size` target ids most frequent in the training answers (SpecForge's rule), with
    the end-of-turn ids always in; ties go to the lower id, so the choice is deterministic."""
    if size > vocab_size:
        raise ValueError(f"--draft-vocab {size} is larger than the target's vocabulary ({vocab_size})")
    counts = Counter(t for row in answers if row["split"] == "train" for t in row["answer_ids"])
    ranked = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    chosen = list(dict.fromkeys([t for t in always if t < vocab_size] + ranked))[:size]
    rest = (t for t in range(vocab_size) if t not in set(chosen))
    while len(chosen) < size:  # fewer distinct tokens than rows: fill with the lowest unused ids
        chosen.append(next(rest))
    return torch.tensor(sorted(chosen), dtype=torch.long)


def end_ids(config: dict, target: str) -> list[int]:
    ids = config.get("eos_token_id")
    gen = Path(target, "generation_config.json")
    if gen.exists():
        ids = json.loads(gen.read_text()).get("eos_token_id", ids)
    return [int(i) for i in (ids if isinstance(ids, list) else [ids] if ids is not None else [])]


def run(plan: Plan, progress=None) -> Path:
    config = target_config(plan.target)
    prompts = read_rows(plan.prompts)[: plan.limit]
    if not prompts:
        raise ValueError(f"{plan.prompts} holds no prompts")
    extra = {name: question_prompts(name, prompts) for name in plan.score_on}  # bad names fail first
    jobs = [(prompts, plan.work), *((questions, score_dir(plan, name)) for name, questions in extra.items())]
    for _, work in jobs:
        work.mkdir(parents=True, exist_ok=True)
    write_answers(plan.target, [(p, work / ANSWERS) for p, work in jobs], plan.max_tokens, plan.concurrency,
                  plan.work / "server.log")  # fmt: skip
    answers = answered(prompts, plan.work)
    shape = HeadShape.from_target(config, plan.draft_vocab)
    paths = write_features(plan.target, answers, plan.work / "features", shape.aux_layer_ids)
    vocab = draft_vocabulary(answers, plan.draft_vocab, shape.vocab_size, end_ids(config, plan.target))
    parts = target_parts(plan.target, vocab, int(config["num_hidden_layers"]))
    head = init_head(shape, vocab, parts, plan.train.seed)
    captured = load_features(paths)  # read once, then split
    train_seqs = [s for s in captured if s["split"] == "train"]
    held = [s for s in captured if s["split"] == "heldout"]
    train_tokens = sum(int(s["ids"].numel()) for s in train_seqs)
    logger.info("training on %d sequences (%d tokens); %d held out", len(train_seqs), train_tokens, len(held))
    train(head, train_seqs, parts, plan.train, plan.work, progress)
    own = [r for r in answers if r["split"] == "heldout"]
    heldout = held_out_report(head, held, own, parts, plan.train.steps, "held out")
    scored = {}
    for name, questions in extra.items():
        work = score_dir(plan, name)
        rows = answered(questions, work)
        seqs = load_features(write_features(plan.target, rows, work / "features", shape.aux_layer_ids))
        scored[name] = held_out_report(head, seqs, rows, parts, plan.train.steps, Path(name).stem)
    provenance = {
        "target": str(plan.target), "prompts": str(plan.prompts), "prompt_count": len(prompts),
        "answers": {"max_tokens": plan.max_tokens, "greedy": True, "count": len(answers)},
        "train": asdict(plan.train), "draft_vocab": plan.draft_vocab,
        "train_tokens": train_tokens, "heldout": heldout, "scored_on": scored,
    }  # fmt: skip
    return export_head(head, plan.target, plan.out, provenance)


def answered(prompts: list[dict], work: Path) -> list[dict]:
    """The answers in `work` to `prompts` (the latest per prompt), in prompt order."""
    order = {(p["id"], p["prompt"]): i for i, p in enumerate(prompts)}
    latest = {(r["id"], r["prompt"]): r for r in read_rows(work / ANSWERS) if (r["id"], r["prompt"]) in order}
    return sorted(latest.values(), key=lambda r: order[(r["id"], r["prompt"])])


def score_dir(plan: Plan, name: str) -> Path:
    return plan.work / f"score-{Path(name).stem}"


def question_prompts(name: str, prompts: list[dict]) -> list[dict]:
    """A question set as held-out prompts; refused when it shares a question with the prompt
    set, since a score on questions the head was taught on would not be held out."""
    rows = [{"id": i, "prompt": r["question"], "split": "heldout"} for i, r in enumerate(load_questions(name))]
    taught = {p["prompt"].strip() for p in prompts}
    shared = [r["prompt"] for r in rows if r["prompt"].strip() in taught]
    if shared:
        raise ValueError(f"--score-on {name}: {len(shared)} of its questions are in the prompt set "
                         f"(first: {shared[0]!r}); score on questions the head was not taught on")  # fmt: skip
    return rows


def held_out_report(head, seqs: list[dict], answers: list[dict], parts: TargetParts, steps: int, label: str) -> dict:
    """The head's chain score on held-out answers, beside the context drafter's on the same ones."""
    result = score(head, seqs, parts.embed, parts.head_rows, steps)
    covered = _coverage(seqs, head.t2d)
    context, shared = context_score(answers, steps), context_score(answers, steps, shared=True)
    logger.info("%s: accept length %.3f (chain of %d; the context drafter %.3f, %.3f with the earlier answers as "
                "its corpus), step accuracy %s, draft vocabulary covers %.4f", label, result.accept_length, steps,
                context, shared, result.step_acc, covered)  # fmt: skip
    return {**asdict(result), "sequences": len(seqs), "vocab_coverage": covered,
            "context_drafter_accept_length": context, "context_drafter_shared_corpus": shared}  # fmt: skip


def _coverage(seqs: list[dict], t2d: torch.Tensor) -> float:
    """The share of the answers' tokens the head can propose (`score` has refused no answers)."""
    ids = torch.cat([s["ids"][s["start"] :].long() for s in seqs])
    return round(float(t2d[ids].float().mean()), 4)
