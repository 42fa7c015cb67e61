"""How often the rule router agrees with the SoT-R manual labels on Vicuna-80.

Run:  .venv/bin/python examples/router_agreement.py [vicuna80 | router_train | path/to.jsonl]

Prints the confusion matrix, accuracy, precision and recall ("positive" = use SoT), how
many questions each rule decided, and every disagreement with the rule that caused it.
No model is needed: this measures the rules alone. For the numbers only, use the eval
command: python -m sglang_specsot.sot.router eval vicuna80
"""

from __future__ import annotations

import sys
from collections import Counter

from sglang_specsot.data import load_questions
from sglang_specsot.sot import measure_agreement, route_question
from sglang_specsot.sot.agreement import labelled_set_path


def main(name: str) -> None:
    rows = load_questions(labelled_set_path(name))
    decisions = [route_question(row["question"]) for row in rows]
    result = measure_agreement((d.use_sot, row["sot_suitable"]) for d, row in zip(decisions, rows))

    print(f"Router vs SoT-R labels on {name}: {len(rows)} questions\n")
    print("                 label SoT   label normal")
    print(f"  router SoT     {result.true_pos:9d}   {result.false_pos:12d}")
    print(f"  router normal  {result.false_neg:9d}   {result.true_neg:12d}\n")
    print(f"  accuracy  {result.accuracy:.3f}")
    print(f"  precision {result.precision:.3f}")
    print(f"  recall    {result.recall:.3f}\n")

    print("Questions decided per rule:")
    for rule, count in Counter(d.rule for d in decisions).most_common():
        print(f"  {rule:12s} {count:3d}")

    misses = [(row, d) for row, d in zip(rows, decisions) if d.use_sot != row["sot_suitable"]]
    print(f"\nDisagreements ({len(misses)}):")
    for number, (row, decision) in enumerate(misses):
        label = "SoT" if row["sot_suitable"] else "normal"
        question = row["question"][:70]
        print(f"  #{row.get('id', number):<3d} label {label:6s} rule {decision.rule:11s} {question}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "vicuna80")
