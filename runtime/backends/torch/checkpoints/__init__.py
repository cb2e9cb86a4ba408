"""Checkpoints and export: the run directory's names, sharded checkpoint files and final weights, the controller's
requests for them at step boundaries, and `rpeg-run export` to a Hugging Face directory."""
