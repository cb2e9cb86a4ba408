"""Size expressions over the workload symbols B, R, Lp, Lr (container sizes, quantile lengths).

An expression is an immutable tree of `Num`, `Sym` and `BinOp`. It evaluates to a number given the
workload, prints in the `.rpeg` syntax with minimal parentheses, and compares structurally.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, Union

SYMBOLS = ("B", "R", "Lp", "Lr")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


@dataclass(frozen=True)
class Num:
    value: int

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Sym:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class BinOp:
    op: str
    lhs: "Expr"
    rhs: "Expr"

    def __str__(self) -> str:
        prec = _PRECEDENCE[self.op]
        left = _wrap(self.lhs, prec, right=False)
        right = _wrap(self.rhs, prec, right=True)
        sep = " " if prec == 1 else ""
        return f"{left}{sep}{self.op}{sep}{right}"


Expr = Union[Num, Sym, BinOp]


def _wrap(e: Expr, parent_prec: int, right: bool) -> str:
    if isinstance(e, BinOp):
        prec = _PRECEDENCE[e.op]
        # Left-associative operators: a right operand of equal precedence needs parentheses.
        if prec < parent_prec or (right and prec == parent_prec):
            return f"({e})"
    return str(e)


def evaluate(e: Expr, env: Mapping[str, int | float]) -> Fraction:
    """Exact value of `e` (a Fraction) under the symbol values in `env`."""
    if isinstance(e, Num):
        return Fraction(e.value)
    if isinstance(e, Sym):
        return Fraction(env[e.name])
    a, b = evaluate(e.lhs, env), evaluate(e.rhs, env)
    if e.op == "+":
        return a + b
    if e.op == "-":
        return a - b
    if e.op == "*":
        return a * b
    if b == 0:
        raise ZeroDivisionError(f"division by zero in '{e}'")
    return a / b


def symbols(e: Expr) -> set[str]:
    if isinstance(e, Sym):
        return {e.name}
    if isinstance(e, BinOp):
        return symbols(e.lhs) | symbols(e.rhs)
    return set()


def product(*factors: Expr) -> Expr:
    out = factors[0]
    for f in factors[1:]:
        out = BinOp("*", out, f)
    return out
