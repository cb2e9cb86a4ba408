"""Spies the scaling tests use to assert how often work is done (a count, never a wall-clock time)."""

from __future__ import annotations

import difflib


class CountingTuple(tuple):
    """A tuple that counts how often it is iterated: a lookup by name that scans it counts once per call."""

    iterations = 0

    def __iter__(self):
        CountingTuple.iterations += 1
        return super().__iter__()


def spy_close_matches(monkeypatch, module) -> list[int]:
    """Record the number of candidates of every `difflib.get_close_matches` call made through `module`."""
    seen: list[int] = []
    real = difflib.get_close_matches

    def spy(word, possibilities, *args, **kwargs):
        seen.append(len(possibilities))
        return real(word, possibilities, *args, **kwargs)

    monkeypatch.setattr(module.difflib, "get_close_matches", spy)
    return seen
