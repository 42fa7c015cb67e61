"""Where SpecSoT's SoT answers differ in time from SoT-only's: per question, the time until the
first branch starts (skeleton and branch prefill) and the branch phase, then their totals
and the geometric mean of SpecSoT / SoT-only latency.

    python phases.py RUN_DIR/cells.jsonl
"""

import json
import math
import sys

A, B = "SoT-server", "SpecSoT-server"
rows: dict[int, dict[str, dict]] = {}
for line in open(sys.argv[1]):
    cell = json.loads(line)
    rows.setdefault(cell["question_id"], {})[cell["config"]] = cell

totals = {A: [0.0, 0.0], B: [0.0, 0.0]}
ratios = []
print("q | SoT-only: start s, branch phase s | SpecSoT: start s, branch phase s | SpecSoT / SoT-only")
for q, cells in sorted(rows.items()):
    if A not in cells or B not in cells or cells[A]["status"] != "ok" or cells[B]["status"] != "ok":
        continue
    out = []
    for name in (A, B):
        branches = cells[name]["branches"]
        start = min(b["start"] for b in branches)
        phase = max(b["end"] for b in branches) - start
        totals[name][0] += start
        totals[name][1] += phase
        out.append(f"{start:.2f}, {phase:.2f}")
    ratios.append(cells[A]["latency"] / cells[B]["latency"])
    print(f"{q} | {out[0]} | {out[1]} | {ratios[-1]:.3f}")
print(f"totals: SoT-only start {totals[A][0]:.1f} s, branches {totals[A][1]:.1f} s; "
      f"SpecSoT start {totals[B][0]:.1f} s, branches {totals[B][1]:.1f} s")  # fmt: skip
print(f"SpecSoT vs SoT-only (speed-up, geometric mean of {len(ratios)}): "
      f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}x")  # fmt: skip
