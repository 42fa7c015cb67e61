"""The most speculation can gain on this machine: SPECSOT's measured costs and acceptance, priced.

Reads a SPECSOT server's /server_info (after it has served something, so the cost model's
overheads and the acceptance by chain depth are measured), and prints for each batch size
the best speed-up over plain decoding any draft budget could reach (`budget.speedup_ceiling`)
at the acceptance the server measured, and at a grid of acceptance rates for comparison; and
the same priced with the steps the server really ran (`measured_step_ms`,
`budget.measured_speedup_ceiling`), which hold what the modelled forwards leave out.
Speed-ups a benchmark measured can then be set against what this hardware allows.

    .venv/bin/python examples/speculation_ceiling.py --url http://127.0.0.1:30000
    .venv/bin/python examples/speculation_ceiling.py --server-info server_info.json
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from itertools import zip_longest

from sglang_specsot.costs.cost_model import CostModel, ForwardCost
from sglang_specsot.bench.ceiling import measured_speedup_ceiling, parse_step_table, specsot_part, speedup_ceiling

BATCH_SIZES = (1, 2, 4, 8, 16)
GRID = (0.5, 0.6, 0.7, 0.8, 0.9)


def load(url: str | None, path: str | None) -> dict:
    """SPECSOT's part of /server_info (`internal_states[0].specsot`), with the server's verify
    window (`speculative_num_draft_tokens`) as `verify_width`: None from a file that holds
    SPECSOT's part alone (a benchmark folder's `specsot-state-*.json`)."""
    if (url is None) == (path is None):
        raise ValueError("pass exactly one of --url (a running SPECSOT server) or --server-info (a saved JSON)")
    if url is not None:
        with urllib.request.urlopen(url.rstrip("/") + "/server_info", timeout=60) as r:
            info = json.loads(r.read())
    else:
        with open(path) as f:
            try:
                info = json.load(f)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path} is not JSON ({exc}): pass a saved /server_info or specsot-state-*.json") from exc
    return {**specsot_part(info), "verify_width": info.get("speculative_num_draft_tokens")}


def cost_model(info: dict) -> CostModel:
    def forward(d: dict) -> ForwardCost:
        return ForwardCost(tuple(d["probe_rows"]), tuple(d["probe_ms"]), d["overhead_ms"])

    cm = info["cost_model"]
    return CostModel(target=forward(cm["target"]), draft=forward(cm["draft"]) if "draft" in cm else None)


def measured_p(info: dict) -> list[float]:
    """Acceptance by depth over every chain source (counts pooled), up to the first depth
    never reached."""
    sources = info.get("acceptance_by_depth", {}).values()
    reached = [sum(column) for column in zip_longest(*(c["reached"] for c in sources), fillvalue=0)]
    accepted = [sum(column) for column in zip_longest(*(c["accepted"] for c in sources), fillvalue=0)]
    out = []
    for r, a in zip(reached, accepted):
        if r == 0:
            break
        out.append(a / r)
    return out


def runner_up_hit(info: dict) -> float:
    """The share of verified runner-ups the target took (0.0 where none were verified)."""
    counts = info.get("runner_ups") or {}
    return counts.get("accepted", 0) / counts["verified"] if counts.get("verified") else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None)
    parser.add_argument("--server-info", default=None)
    parser.add_argument("--max-budget", type=int, default=7, help="longest chain priced for the grid")
    args = parser.parse_args()
    try:
        info = load(args.url, args.server_info)
        steps = parse_step_table(info.get("measured_step_ms") or {})
    except ValueError as exc:
        parser.error(str(exc))
    cost = cost_model(info)
    draft = cost.draft is not None
    # A server that reports `step_extends` extends only what the chain did not write
    # (drafters/model_extend.DeferredExtend.draft_extend); without it the whole window is priced as extended.
    narrow = "step_extends" in (info.get("draft_extend") or {})
    ps = measured_p(info)
    hit, width = runner_up_hit(info), info.get("verify_width")
    print(f"cost model (as the server measured it): {json.dumps(info['cost_model'])}")
    print(f"measured acceptance by depth: {[round(p, 3) for p in ps] or 'none (nothing drafted yet)'}")
    if draft:
        print(f"draft-extend priced over {'what the chain did not write' if narrow else 'the whole verify window'}")
    else:
        # Context drafting has a draft only where the context matches, and its acceptance by
        # depth counts those steps alone: both columns price a draft in every step and read
        # too high wherever the context often has no match.
        print("no draft model: these ceilings assume a context draft every step; where the context "
              "has no match a step is plain, so check them against a step log (examples/step_log_report.py)")
    if hit:
        print(f"runner-ups: {hit:.3f} of those verified were taken; priced beside each drafted token, "
              + (f"up to {width} nodes a request" if width else "the verify window unknown (a trimmed state does not hold it)"))
    header = ["bs", "measured steps", "measured"] + [f"p={p}" for p in GRID]
    print(" | ".join(f"{h:>14}" for h in header))
    for bs in BATCH_SIZES:
        cells = [f"{bs:>14}"]
        real = measured_speedup_ceiling(steps, bs, ps) if ps else None
        cells.append(f"{real[0]:>8.2f}x w={real[1]:<2}" if real else f"{'-':>14}")
        for p_by_depth in ([ps] if ps else [[]]) + [[p] * args.max_budget for p in GRID]:
            gain, budget = speedup_ceiling(
                cost, bs, p_by_depth, draft, narrow_extend=narrow, runner_up_hit=hit, max_width=width
            )  # fmt: skip
            cells.append(f"{gain:>8.2f}x b={budget:<2}" if p_by_depth else f"{'-':>14}")
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
