"""The names inside a torch run's directory (--run-dir): what rpeg-run checks before it starts a run and the
backend writes. Kept apart from checkpoint.py so that rpeg-run can read them without importing torch."""

CHECKPOINT_DIR = "checkpoints"  # step-NNNNNN/ directories, each an index and its safetensors shards
FINAL = "final"  # the final weights, laid out like a checkpoint
WORKER_LOGS = "workers"  # one log per worker process
