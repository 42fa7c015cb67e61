"""`python -m sglang_specsot.models` (also `specsot-models`): fetch, list and build test models.

stdout carries only the answer (a directory, or the list); progress and errors go to stderr, so
`MODEL=$(python -m sglang_specsot.models fetch smollm2-135m)` works in scripts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from sglang_specsot.models.fetcher import FetchError, fetch, fetched_path
from sglang_specsot.models.registry import MODELS, get_spec, model_dir, models_root
from sglang_specsot.models.tiny import TinySpec, build_tiny_model

PROG = "python -m sglang_specsot.models"


def _cmd_list(args: argparse.Namespace) -> int:
    for spec in MODELS.values():
        state = "fetched" if fetched_path(spec.name) else "not fetched"
        print(f"{spec.name:<20} {spec.hf_name:<38} {spec.gguf_bytes / 2**20:6.0f} MiB GGUF  {state}")
    print(f"checkpoints live under {models_root()}", file=sys.stderr)
    return 0


def _cmd_path(args: argparse.Namespace) -> int:
    path = fetched_path(args.name)
    if path is None:
        print(f"{args.name} is not fetched (expected in {model_dir(get_spec(args.name))}); "
              f"run: {PROG} fetch {args.name}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    print(fetch(args.name))
    return 0


def _cmd_tiny(args: argparse.Namespace) -> int:
    spec = TinySpec(vocab_size=args.vocab_size, hidden_size=args.hidden, num_layers=args.layers,
                    num_heads=args.heads, num_kv_heads=args.kv_heads, seed=args.seed, dtype=args.dtype,
                    init_std=args.init_std)
    print(build_tiny_model(args.out, spec))
    return 0


def _cmd_truncate(args: argparse.Namespace) -> int:
    from sglang_specsot.models.truncate import truncate_model

    src = fetched_path(args.source) if args.source in MODELS else Path(args.source)
    if src is None:
        raise ValueError(f"{args.source} is not fetched; run: {PROG} fetch {args.source}")
    print(truncate_model(src, args.out, args.layers))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the models that can be fetched").set_defaults(run=_cmd_list)
    for name, run, text in (("fetch", _cmd_fetch, "download, verify and convert; prints the directory"),
                            ("path", _cmd_path, "print the directory of a fetched model")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("name", help=f"one of: {', '.join(MODELS)}")
        cmd.set_defaults(run=run)
    _add_tiny(sub)
    cut = sub.add_parser("truncate", help="a draft model: the first --layers decoder layers of a model")
    cut.add_argument("source", help=f"a fetched model ({', '.join(MODELS)}) or a checkpoint directory")
    cut.add_argument("--layers", type=int, required=True, help="decoder layers to keep")
    cut.add_argument("--out", type=Path, required=True, help="directory to write (must not exist or be empty)")
    cut.set_defaults(run=_cmd_truncate)
    _add_train_eagle3(sub)
    return parser


def _add_train_eagle3(sub) -> None:
    from dataclasses import fields

    from sglang_specsot.models.eagle3.pipeline import Plan
    from sglang_specsot.models.eagle3.train import TrainConfig

    d, plan = TrainConfig(), {f.name: f.default for f in fields(Plan)}
    cmd = sub.add_parser("train-eagle3", help="train an EAGLE-3 head for a target on its own answers (resumable)")
    cmd.add_argument("target", help=f"a fetched model ({', '.join(MODELS)}) or a checkpoint directory")
    cmd.add_argument("--work", type=Path, help="where stages keep their output (default: <cache>/eagle3-work/NAME)")
    cmd.add_argument("--out", type=Path, help="the head's directory (default: <cache>/eagle3/NAME)")
    cmd.add_argument("--prompts", type=Path, help="a JSON-lines prompt set with id, split, prompt (default: the shipped one)")
    cmd.add_argument("--limit", type=int, help="use only the first N prompts")
    cmd.add_argument("--max-tokens", type=int, default=plan["max_tokens"], help="answer length cap")
    cmd.add_argument("--concurrency", type=int, default=plan["concurrency"], help="answers generated at once (rows are cheap in a batch)")
    cmd.add_argument("--draft-vocab", type=int, default=plan["draft_vocab"], help="target ids the head can propose (the most frequent in the answers)")
    cmd.add_argument("--steps", type=int, default=d.steps, help="training-time-test depth (draft chain length)")
    cmd.add_argument("--epochs", type=int, default=d.epochs)
    cmd.add_argument("--lr", type=float, default=d.lr)
    cmd.add_argument("--accumulate", type=int, default=d.accumulate, help="sequences per update")
    cmd.add_argument("--seed", type=int, default=d.seed)
    cmd.add_argument("--score-on", action="append", default=[], metavar="QUESTIONS",
                     help="also score the head (and the context drafter) on the target's answers to this question set "
                          "(a name or a .jsonl path with 'question' rows); repeatable, and a rerun after training "
                          "only adds the scores")  # fmt: skip
    cmd.set_defaults(run=_cmd_train_eagle3)


def _cmd_train_eagle3(args: argparse.Namespace) -> int:
    from sglang_specsot.models.eagle3.pipeline import PROMPTS, Plan, run
    from sglang_specsot.models.eagle3.progress import Bar
    from sglang_specsot.models.eagle3.train import TrainConfig

    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit {args.limit} must be at least 1")
    if args.target in MODELS:
        target = fetched_path(args.target)
        if target is None:
            raise ValueError(f"{args.target} is not fetched; run: {PROG} fetch {args.target}")
    else:
        target = Path(args.target)
    name = target.name
    cfg = TrainConfig(steps=args.steps, epochs=args.epochs, lr=args.lr, accumulate=args.accumulate, seed=args.seed)
    plan = Plan(target=str(target), work=args.work or models_root().parent / "eagle3-work" / name,
                out=args.out or models_root() / "eagle3" / name, prompts=args.prompts or PROMPTS,
                limit=args.limit, max_tokens=args.max_tokens, concurrency=args.concurrency,
                draft_vocab=args.draft_vocab, train=cfg, score_on=tuple(args.score_on))  # fmt: skip
    with Bar() as bar:
        print(run(plan, bar.update))
    return 0


def _add_tiny(sub) -> None:
    defaults = TinySpec()
    tiny = sub.add_parser("tiny", help="build a tiny random-weight Llama with a trained BPE tokenizer")
    tiny.add_argument("--out", type=Path, required=True, help="directory to write (must not exist or be empty)")
    tiny.add_argument("--vocab-size", type=int, default=defaults.vocab_size)
    tiny.add_argument("--hidden", type=int, default=defaults.hidden_size)
    tiny.add_argument("--layers", type=int, default=defaults.num_layers)
    tiny.add_argument("--heads", type=int, default=defaults.num_heads)
    tiny.add_argument("--kv-heads", type=int, default=defaults.num_kv_heads)
    tiny.add_argument("--seed", type=int, default=defaults.seed)
    tiny.add_argument("--init-std", type=float, default=defaults.init_std, help="std of the random weights")
    tiny.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=defaults.dtype)
    tiny.set_defaults(run=_cmd_tiny)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[specsot-models] %(message)s")
    try:
        return args.run(args)
    except (FetchError, ValueError, OSError) as exc:
        # Bad input, no network, a checksum or a full disk: one line the user can act on.
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; temporary files were removed and the caches hold only finished work",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
