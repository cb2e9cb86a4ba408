"""The analytical cost model (docs/cost-model-spec.md): work and parameter counts, operator and transfer times,
collectives, memory and residency, the hardware profile, the cost options, annotate-cost and its explanation."""
