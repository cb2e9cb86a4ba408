"""The models a worker builds: the decoder-only transformer, Hugging Face checkpoints read offline, generation with a
KV cache, and the precision and master weights a model trains in."""
