"""Tokens per verify from candidates a target makes itself, simulated with HF transformers.

Issue #11 item 3 asks SPECSOT to fill free verify rows with candidates that need no second
model, e.g. lookahead (Jacobi) n-grams. This counts what each source would commit per verify
under greedy decoding (lossless: the output is the target's greedy text), before building it:

  jacobi  the previous verify's outputs after its first rejected position, as next guesses
  pool    an n-gram pool of every verify's outputs, keyed by the token before them (lookahead
          with a window of one column)
  ctx     prompt lookup: the tokens after the last earlier occurrence of the text's last 3
          (else 2) tokens, SPECSOT's context drafting in its simplest form

Each step verifies every available candidate chain of K tokens after the last token (one
forward each here; one tree in a real verify) and keeps the longest accepted.

  python simulate.py MODEL_DIR K MAX_TOKENS QUESTIONS.jsonl N_QUESTIONS jacobi   # jacobi + pool
  python simulate.py MODEL_DIR K MAX_TOKENS QUESTIONS.jsonl N_QUESTIONS ctx      # + ctx
  python simulate.py MODEL_DIR K MAX_TOKENS QUESTIONS.jsonl N_QUESTIONS ctx only # ctx alone
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(1)
M = sys.argv[1]; K = int(sys.argv[2]); N_TOK = int(sys.argv[3])  # fmt: skip
tok = AutoTokenizer.from_pretrained(M); model = AutoModelForCausalLM.from_pretrained(M, dtype=torch.float32).eval()
qs = [json.loads(l)["question"] for l in open(sys.argv[4])][:int(sys.argv[5])]
tot_steps = tot_tok = 0; src = {"jacobi": 0, "pool": 0, "ctx": 0}
CTX = sys.argv[6] == "ctx"
ONLY_CTX = len(sys.argv) > 7
for q in qs:
    ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model(ids, use_cache=True); cache = out.past_key_values
        last = int(out.logits[0, -1].argmax()); gen = [last]
        guess = [tok.pad_token_id or 0] * K; pool = {}  # token -> list of following tokens
        steps = 0
        while len(gen) < N_TOK:
            cands = {} if ONLY_CTX else {"jacobi": guess}
            if last in pool and not ONLY_CTX: cands["pool"] = pool[last]
            if CTX:
                hist = ids[0].tolist() + gen
                for n in (3, 2):  # prompt lookup: the longest recent suffix seen before
                    suf = hist[-n:]
                    hit = next((i for i in range(len(hist) - n - 1, -1, -1) if hist[i:i + n] == suf), None)
                    if hit is not None:
                        g = hist[hit + n: hit + n + K]
                        cands["ctx"] = g + [0] * (K - len(g)); break
            best = None
            for name, g in cands.items():
                # verify chain g after `last` (one forward each; a real tree would share one forward)
                inp = torch.tensor([[last] + g])
                o = model(inp, past_key_values=cache, use_cache=True).logits[0].argmax(-1).tolist()
                j = 0
                while j < K and g[j] == o[j]: j += 1
                cache.crop(cache.get_seq_length() - (K + 1))
                if best is None or j > best[1]: best = (name, j, o)
            if best is None:  # nothing to verify: a plain one-token step
                o = model(torch.tensor([[last]]), past_key_values=cache, use_cache=True).logits[0].argmax(-1).tolist()
                new = [o[0]]; gen += new; last = new[-1]; steps += 1
                if last == tok.eos_token_id or last == 151645: break
                continue
            name, j, o = best
            commit = ([last] + (cands[name][:j]))  # tokens whose KV we keep
            out = model(torch.tensor([commit]), past_key_values=cache, use_cache=True)
            new = cands[name][:j] + [o[j]]
            # the n-gram pool: each verify's outputs after a wrong guess are the target's own guesses
            for a in range(len(o) - 1): pool[o[a]] = o[a + 1: a + 1 + K] + [0] * (K - len(o[a + 1: a + 1 + K]))
            if j: src[name] += j
            gen += new; last = new[-1]; steps += 1
            guess = (o[j + 1:] + [0] * K)[:K]
            if last == tok.eos_token_id or last == 151645: break
        tot_steps += steps; tot_tok += len(gen) - 1
        print(f"q: {q[:50]!r} tokens {len(gen)-1} steps {steps} tokens/step {(len(gen)-1)/steps:.3f}", flush=True)
print(f"K={K} sources={sys.argv[6:]}: tokens/step {tot_tok/tot_steps:.3f} accepted from {src} of {tot_tok}")
