"""Plain decoding through `--attention-backend specsot_cpu` vs SGLang's own `torch_native`.

One run, two CPU servers up side by side but measured alternately (the machine has 2 cores: only
the server being measured works, the other sleeps), the same greedy prompts, ROUNDS alternating
rounds; prints decode tok/s of each and the median of the per-round ratios specsot_cpu /
torch_native with its quartiles ("no slower" when 1.0 is not above the upper quartile). With no argument it builds a tiny
random Llama in /tmp (transformers' LlamaConfig and a small BPE tokenizer trained here);
pass a model directory to use a real one, and `--dtype bfloat16` to measure as served:

    .venv/bin/python examples/bench_cpu_attention.py [MODEL_DIR] [--dtype bfloat16] [--rounds N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

from tqdm import tqdm

from sglang_specsot.launch import ServerProcess

SEED = 0
ROUNDS = 16  # alternating rounds; each round times both backends on the same prompts
MAX_NEW_TOKENS = 96
BATCH = 4  # prompts sent together: decode runs at batch 1..BATCH
PROMPTS = [
    "The quick brown fox",
    "Speculative decoding verifies",
    "On a small CPU the attention",
    "Skeleton of thought first writes",
]
BACKENDS = ["torch_native", "specsot_cpu"]
SERVER_ARGS = [
    "--device", "cpu", "--max-total-tokens", "4096", "--log-level", "warning",
    "--sleep-on-idle", "--disable-radix-cache", "--random-seed", str(SEED),
]  # fmt: skip
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=512)  # fmt: skip


def build_tiny_model(path: Path, seed: int = SEED) -> Path:
    """A random-weight Llama with a 512-token BPE tokenizer trained on a few sentences."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (path / "config.json").exists():
        return path
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY["vocab_size"], special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator([p * 20 for p in PROMPTS] + [__doc__ or ""], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(seed)
    config = LlamaConfig(
        **TINY, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False, initializer_range=0.08, torch_dtype="float32",
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(path)
    fast.save_pretrained(path)
    return path


def _generate(server: ServerProcess, max_new_tokens: int) -> tuple[float, list[list[int]]]:
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    start = time.perf_counter()
    outs = server.post("/generate", {"text": PROMPTS[:BATCH], "sampling_params": params})
    return time.perf_counter() - start, [o["output_ids"] for o in outs]


def decode_rate(server: ServerProcess) -> tuple[float, list[list[int]]]:
    """Decode tok/s: (full generation - one-token generation) removes prefill and HTTP time."""
    t_one, _ = _generate(server, 1)
    t_full, ids = _generate(server, MAX_NEW_TOKENS)
    return BATCH * (MAX_NEW_TOKENS - 1) / (t_full - t_one), ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="model directory (default: a tiny random Llama)")
    ap.add_argument("--dtype", default="float32", help="the servers' --dtype (default float32)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"alternating rounds (default {ROUNDS})")
    args = ap.parse_args()
    model = args.model or str(build_tiny_model(Path("/tmp/specsot-tiny-llama")))
    server_args = [*SERVER_ARGS, "--dtype", args.dtype]
    rates: dict[str, list[float]] = {b: [] for b in BACKENDS}
    texts: dict[str, list[list[int]]] = {}
    with contextlib.ExitStack() as stack:
        # Started one after the other; an idle server sleeps (--sleep-on-idle), so only the
        # one being measured uses the cores.
        servers = {
            b: stack.enter_context(ServerProcess(model, args=[*server_args, "--attention-backend", b]))
            for b in BACKENDS
        }
        for server in servers.values():
            decode_rate(server)  # warm-up
        for r in tqdm(range(args.rounds), desc="rounds"):
            order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]  # alternate who goes first
            for backend in order:
                rate, texts[backend] = decode_rate(servers[backend])
                rates[backend].append(rate)
                tqdm.write(f"round {r + 1}/{args.rounds} {backend:>12}: {rate:8.1f} decode tok/s")
    med = {b: statistics.median(v) for b, v in rates.items()}
    # Each round's two runs are back to back, so their ratio cancels the slow drifts of a shared
    # machine; the quartiles of those paired ratios show how much noise is left.
    pairs = sorted(s / t for s, t in zip(rates["specsot_cpu"], rates["torch_native"]))
    q1, ratio, q3 = statistics.quantiles(pairs, n=4)
    same = texts["specsot_cpu"] == texts["torch_native"]
    print(json.dumps({"model": model, "dtype": args.dtype, "median_tok_s": {b: round(v, 1) for b, v in med.items()},
                      "paired_ratio_median": round(ratio, 3), "paired_ratio_iqr": [round(q1, 3), round(q3, 3)],
                      "greedy_ids_identical": same}))  # fmt: skip
    verdict = "no slower" if q3 >= 1.0 else "SLOWER"
    print(f"specsot_cpu / torch_native decode tok/s = {ratio:.3f} (IQR {q1:.3f}-{q3:.3f}: {verdict}); "
          f"greedy outputs identical: {same}")  # fmt: skip

if __name__ == "__main__":
    main()
