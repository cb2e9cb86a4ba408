"""Small `.rpeg` programs several test modules write to files (not a test module itself)."""

import re
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GRPO_TWO_WORKERS = EXAMPLES / "grpo-tiny-2.rpeg"


def lowering(steps: int) -> str:
    """The pass pipeline that lowers, costs and schedules a module unrolled for `steps` RL steps."""
    return f"verify-wellformed,unroll{{k={steps}}},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"


def compile_example(name: str, out: str, steps: int) -> str:
    """examples/NAME.rpeg lowered for `steps` RL steps into the exec module `out` (returned)."""
    from rpegc.cli import main as rpegc_main

    assert rpegc_main([str(EXAMPLES / f"{name}.rpeg"), "-p", lowering(steps), "-o", out]) == 0
    return out


def grpo_two_workers(workload: str, actor: str, ref: str, train: str, quantiles: bool = True) -> str:
    """examples/grpo-tiny-2.rpeg (GRPO on 2 CPU workers, every vertex on both) with its workload line, the
    actor's and the reference's model lines and the training vertex's placement line replaced; without its
    response-length quantiles (one generation node per step) when `quantiles` is false."""
    text = GRPO_TWO_WORKERS.read_text()
    if not quantiles:
        text, n = re.subn(r"^  rpeg\.quantiles .*\n", "", text, count=1, flags=re.M)
        assert n == 1, f"{GRPO_TWO_WORKERS.name} has no rpeg.quantiles line"
    for start, line in (("rpeg.workload ", workload), ("rpeg.model @actor ", actor), ("rpeg.model @ref ", ref),
                        ("  @train_actor ", train)):
        text, n = re.subn(rf"^{re.escape(start)}.*$", lambda _m, line=line: line, text, count=1, flags=re.M)
        assert n == 1, f"{GRPO_TWO_WORKERS.name} has no line starting {start!r}"
    return text

# One trainable actor: generation feeds training, training publishes back (no cluster, no plan).
ACTOR_GRAPH = """rpeg.workload {B = 64, R = 1, Lp = 128, Lr = 384, dtype = bf16}
rpeg.model @actor {arch = "tiny", kind = policy, trainable}
rpeg.graph @g {
  %X = rpeg.container tokens[B, Lp]
  %Y = rpeg.container tokens[B*R, Lp + Lr]
  %W = rpeg.weights @actor
  rpeg.input %X
  rpeg.vertex @gen   generation @actor reads(%W, %X) writes(%Y)
  rpeg.vertex @train training   @actor reads(%W, %Y) writes(%W)
  rpeg.data @gen -> @train (%Y)
  rpeg.publish @train -> @gen (%W)
}
"""
