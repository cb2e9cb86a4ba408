"""The environment every worker process runs under, set in the fork server before it imports torch (the pool
preloads this module first; MKL reads it once, when it loads).

MKL keeps the workspace of a freed matrix product in a cache of its own (~15 MiB per process after products of a
few hundred rows) and never returns it: memory that no plan prices and that the C heap's peak meter would count as
the worker's. Disabling the cache measured no slowdown of products from 64 to 512 rows. A user's own setting wins;
workers started by torchrun or Slurm (`python -m rpegc.runtime.backends.torch.worker.process`) take theirs from the
launcher's environment.
"""

from __future__ import annotations

import os

WORKER_ENV = {"MKL_DISABLE_FAST_MM": "1"}

for _name, _value in WORKER_ENV.items():
    os.environ.setdefault(_name, _value)
