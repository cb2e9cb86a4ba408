"""Runtime backends: sim and torch."""
