"""Small `.rpeg` programs several test modules write to files (not a test module itself)."""

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
