"""The control channel between the controller and its workers: sealed, schema-checked messages and what a worker
is told at start (tensors never travel here; they go over torch.distributed)."""
