"""The model and RL-math layer of the torch backend (DESIGN.md §7; paper Sec. VII and App. B).

Modules (each imports torch itself, so importing this package does not):
- `models`     small decoder-only transformers built from `rpegc.core.program.Arch`, with LM and scalar heads
- `generation` batched KV-cache sampling with per-sequence generators (layout-independent rollouts)
- `rl`         log-probs, KL estimators, GAE, PPO/GRPO losses, gradient clipping, Adam (`RLConfig`)
- `tasks`      verifiable reward rules for toy tasks a tiny actor can learn on a CPU
- `reference`  the single-process reference trainer: the oracle for the distributed backend at tau = 0
- `pinning`    one core per CPU worker, as rpeg-calibrate measures and the backend runs
"""
