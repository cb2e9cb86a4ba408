"""The controller side of a torch run: the backend that dispatches nodes and reacts to completions, the worker
pool and its health, the routing of shards between workers, the memory check, devices, core pinning, the verifier pool
and rpeg-run's options of this backend."""
