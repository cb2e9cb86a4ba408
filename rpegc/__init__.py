"""rpegc: a compiler and runtime for RL post-training pipelines of reasoning LLMs (RPEG).

The public Python API (rpegc/api.py): `parse`, `load`, `to_text`, `to_json`/`from_json`, `to_mlir`/`from_mlir`,
`run_pipeline`, `optimize`, `lower`, `schedule`, `explain`, and the dataclasses `Program` and `CostOptions`;
errors are `RpegError`. The command-line tools are `rpegc`, `rpeg-run`, `rpeg-calibrate` and `rpeg-validate`.
"""

__version__ = "0.1.0"

from rpegc.api import (  # noqa: E402  (after __version__: rpegc.version reads it)
    CostOptions,
    Program,
    RpegError,
    explain,
    from_json,
    from_mlir,
    load,
    lower,
    optimize,
    parse,
    pass_spec,
    run_pipeline,
    schedule,
    to_json,
    to_mlir,
    to_text,
)

__all__ = [
    "CostOptions", "Program", "RpegError", "__version__", "explain", "from_json", "from_mlir", "load", "lower",
    "optimize", "parse", "pass_spec", "run_pipeline", "schedule", "to_json", "to_mlir", "to_text",
]
