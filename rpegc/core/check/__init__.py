"""Legality: the well-formedness rules of a program (verify-wellformed), the plan rules, and each vertex's
candidate strategies."""
