"""RL and algorithms: the math of one step, the algorithms (PPO, GRPO, DPO), their hyper-parameters, prompts,
datasets, tasks and rewards, the finite-number guard and the single-process reference trainer."""
