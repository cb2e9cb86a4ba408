"""A reward plugin in verl's form for the arithmetic prompts of `python -m rpegc.tools.arith`:

    rpeg-run PLAN --backend torch --data arith/train.jsonl --reward examples/arith_reward.py:compute_score

1 for the right number, 0.1 for any number (so a model that has not learned the format yet gets a signal),
0 otherwise; `acc` is what the accuracy metric averages.
"""

import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    numbers = re.findall(r"-?\d+", solution_str)
    if not numbers:
        return {"score": 0.0, "acc": 0.0}
    right = numbers[0] == ground_truth.strip()
    return {"score": 1.0 if right else 0.1, "acc": float(right)}
