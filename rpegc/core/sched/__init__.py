"""Scheduling: the list scheduler (Alg. 5), the schedule pass over a program, and the score."""
