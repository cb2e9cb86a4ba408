"""Helpers of the IR's frozen dataclasses: source-location fields and lookups by name."""

from __future__ import annotations

from dataclasses import field

from rpegc.core.ir.errors import UNKNOWN_LOC


def loc_field():
    # A fresh Field per attribute: one shared Field object would be renamed by every class
    # that uses it, which breaks __init__ and replace() for classes with several Loc fields.
    return field(default=UNKNOWN_LOC, compare=False, repr=False)


def first_by_name(owner, field_name: str, items: tuple, key) -> dict:
    """An index name -> first of `items` (derived from the field `field_name` of the frozen `owner`), built
    once per object.

    Lookups by name used to scan the tuple, which made passes over a graph of n vertices or containers
    O(n^2). The index lives in the instance's __dict__ beside the fields (which never change): equality,
    repr and dataclasses.replace see only the fields, and a replaced object builds its own index."""
    cache = owner.__dict__.get("_index")
    if cache is None:
        cache = {}
        object.__setattr__(owner, "_index", cache)
    index = cache.get(field_name)
    if index is None:
        index = {}
        for item in items:
            index.setdefault(key(item), item)
        cache[field_name] = index
    return index
