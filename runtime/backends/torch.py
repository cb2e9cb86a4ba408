"""`--backend torch` of rpeg-run: the real execution backend lives in `rpegc.runtime.torch_backend`."""

from rpegc.runtime.torch_backend.backend import TorchBackend

__all__ = ["TorchBackend"]
