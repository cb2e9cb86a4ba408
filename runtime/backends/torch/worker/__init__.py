"""The worker side of a torch run: the persistent worker process (one per device; `process`: its command loop and
entry points) and its parts, which share one `holdings.Holdings`: `holdings` (what it holds, install / keep /
release), `transfers` (rows and weights to and from other workers), `operators` (Op nodes and fusions; what an
algorithm's vertices call), `step_inputs` (a step's prompts and the reward function), `train_states`, `shard_writer`
(its checkpoint and final-weights files); its environment, the sending thread, fused members' threads and what it
measures of its memory."""
