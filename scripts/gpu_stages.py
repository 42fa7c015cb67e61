"""The stages of the device check (scripts/gpu_check.py), one process each:

    python3 scripts/gpu_stages.py {cost,masks,parity,tree,vocab,replay} --out FILE.jsonl [--smoke] [--limit S]
                                  [--traces DIR] [--pairs 1.5b,7b]

One module per stage: gpu_stage_cost.py, gpu_stage_masks.py, gpu_stage_parity.py (with its
engines' sync counts, gpu_stage_syncs.py), gpu_stage_replay.py (`--traces`, `--pairs`); tree
and vocab are in gpu_stages_cuda_path.py.

Each appends JSON lines to FILE as results come, prints a line per result, and ends with one
line carrying `status` (ok, failed, blocked) and, when not ok, `blocker`: the exact exception
that stopped it. `--smoke` runs the same code in small shapes on the CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the stages' modules beside this one
sys.path.insert(0, str(ROOT))  # sglang_specsot, which the stages import

import gpu_stage_cost as cost  # noqa: E402
import gpu_stage_masks as masks  # noqa: E402
import gpu_stage_parity as parity  # noqa: E402
from gpu_record import Recorder, blocker  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("cost", "masks", "parity", "tree", "vocab", "replay"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--limit", type=float, default=600, help="the stage's limit in seconds (gpu_check.py)")
    parser.add_argument("--smoke", action="store_true", help="small shapes, on the CPU")
    parser.add_argument("--traces", type=Path, default=os.environ.get("SPECSOT_GPU_TRACES") or None,
                        help="replay: the trace folder (default: the newest benchmarks/traces-*)")  # fmt: skip
    parser.add_argument("--pairs", default=os.environ.get("SPECSOT_GPU_PAIRS") or "1.5b,7b",
                        help="replay: the model pairs, in order (default 1.5b,7b)")  # fmt: skip
    args = parser.parse_args(argv)
    rec = Recorder(args.out, args.stage)
    try:
        if args.stage == "cost":
            cost.stage_cost(rec, cost.SMOKE_COST if args.smoke else cost.DEVICE_COST)
        elif args.stage == "masks":
            masks.stage_masks(rec, masks.SMOKE_MASKS if args.smoke else masks.DEVICE_MASKS)
        elif args.stage in ("tree", "vocab"):
            import gpu_stages_cuda_path as cuda_path

            getattr(cuda_path, f"stage_{args.stage}")(rec, args.smoke, args.limit)
        elif args.stage == "replay":
            import gpu_stage_replay as replay

            replay.stage_replay(rec, args.smoke, args.limit, args.traces, [p for p in args.pairs.split(",") if p])
        else:
            parity.stage_parity(rec, parity.SMOKE_PARITY if args.smoke else parity.DEVICE_PARITY, args.smoke)
    except Exception as exc:  # the stage's own blocker, recorded; the run goes on to the next
        rec.finish("blocked", blocker(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
