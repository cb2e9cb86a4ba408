"""Model parallelism on a worker: layouts of shards, one rank's share of a model (TP, PP, DP with ZeRO), the
links between pipeline stages, the pipelined schedules and megatron-core's tensor-parallel layers."""
