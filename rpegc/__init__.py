"""rpegc: a compiler and runtime for RL post-training pipelines of reasoning LLMs (RPEG)."""

__version__ = "0.1.0"
