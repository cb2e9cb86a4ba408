"""Issue 32, item 5: how far the two terms the memory model lacks explain the per-operator memory validation.

Re-predicts the committed measurements (`bench/validation/memory/validation.csv`, nothing is run) with the cost
model's peak plus:
- training: a recomputed layer's saved bytes as the torch backend holds them (`bench/layer_activations.py`:
  s_b (5 d + 4 d/P_t + 4 d_ff/P_t) + 4 (n_heads/P_t + 2) per token, + 6 d in bf16; the two RMSNorms' 5 d are
  replicated over TP), for the c layers of the segment being recomputed, in place of [A12]'s buffer width, beside
  the retained segment inputs;
- serving operators with an LM head: the two float32 pieces of vocabulary-wide log-softmax `rl.token_logprobs`
  holds (rl.LOGPROB_PIECE elements each, or one sequence's row when that is larger).
Prints MAPE and Spearman per role for the model as it is and with the two terms. Usage:
    .venv/bin/python bench/memory_terms.py [CSV]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from rpegc.core.cost.hardware import load_hardware
from rpegc.core.cost.memory import checkpoint_interval, op_memory
from rpegc.core.cost.options import CostOptions
from rpegc.runtime.backends.torch.rl import LOGPROB_PIECE
from rpegc.tools.validate import ROLES, Case, predict, read_csv, scores

CSV = Path(__file__).resolve().parent / "validation" / "memory" / "validation.csv"


def recomputed_layer_bytes(case: Case) -> float:
    """Bytes per token one recomputed block of the backend saves for its backward pass."""
    a, s_b, tp = case.arch, case.workload.s_b, case.tp
    ffn = (4 if a.gated else 2) * a.ffn / tp
    return s_b * (5 * a.hidden + 4 * a.hidden / tp + ffn) + 4 * (a.heads / tp + 2) + (6 * a.hidden if s_b < 4 else 0)


def missing_bytes(case: Case) -> float:
    """What the two terms add to the model's peak of the case's worst device."""
    a, wl = case.arch, case.workload
    b_loc, ell = wl.B * wl.R / (case.dp * case.mb), wl.Lp + wl.Lr
    mem = op_memory(case.role, a, case.kind, wl, dp=case.dp, pp=case.pp, tp=case.tp, mb=case.mb)
    if case.role == "training":
        layers = a.layers / case.pp
        c = float(checkpoint_interval(layers))
        live = min(case.mb, case.pp)
        held = live * b_loc * ell * (wl.s_b * np.ceil(layers / c) * a.hidden + c * recomputed_layer_bytes(case))
        return max(0.0, held - float(mem.M_act))
    if case.kind not in ("policy", "reference"):
        return 0.0
    per_row = (wl.Lr if case.role == "inference" else 1) * a.vocab
    return 2 * 4 * min(b_loc, max(1, LOGPROB_PIECE // per_row)) * per_row


def main(argv: list[str]) -> None:
    rows = read_csv(Path(argv[0]) if argv else CSV)
    hw = load_hardware("cpu")  # memory does not depend on the profile
    measured = [peak for _, _, peak in rows]
    now = [predict(case, hw, CostOptions(), 1).peak_bytes for case, _, _ in rows]
    added = [p + missing_bytes(case) for p, (case, _, _) in zip(now, rows)]
    for name, pred in (("the model now", now), ("with the two terms", added)):
        s = scores(pred, measured)
        per_role = [(role, scores([p for p, (c, _, _) in zip(pred, rows) if c.role == role],
                                  [m for m, (c, _, _) in zip(measured, rows) if c.role == role]).mape)
                    for role in ROLES]
        print(f"{name:<20} MAPE {s.mape:6.1%}  Spearman {s.spearman:.3f}  bias {s.bias:+6.1%}  "
              + "  ".join(f"{role} {m:.1%}" for role, m in per_role))


if __name__ == "__main__":
    main(sys.argv[1:])
