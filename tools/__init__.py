"""rpegc tools: Gantt charts, calibration, validation, benchmarks helpers."""
