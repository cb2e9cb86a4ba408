"""rpegc runtime: completion-driven controller, traces and verification, backends. Never imports xDSL."""
