"""The analytical cost model (spec/cost-model.md): work and parameter counts, operator and transfer times,
collectives, memory and residency, the hardware profile, the cost options, annotate-cost and its explanation."""
