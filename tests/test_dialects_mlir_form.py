"""The MLIR text form (dialects/mlir_form.py): what rpegc prints is what LLVM's mlir-opt reads, and what mlir-opt
prints of it (sorted properties, `module`, location aliases after the module, escaped file names) reads back to
the same program. These run without mlir-opt; lit_tests/emit/mlir-opt-roundtrip.test runs the real tool."""

from __future__ import annotations

import re

import pytest
from xdsl.utils.exceptions import ParseError

from rpegc.core.ir.errors import UNKNOWN_LOC, Loc, RpegError
from rpegc.dialects.convert import make_context, module_to_program, program_to_module
from rpegc.dialects.mlir_form import parse_mlir, print_mlir
from rpegc.syntax.parser import parse
from fixtures.programs import EXAMPLES

PPO_TEXT = (EXAMPLES / "ppo.rpeg").read_text()


def mlir_opt_style(text: str) -> str:
    """`text` as `mlir-opt --mlir-print-debuginfo` writes it: `module`, and every inline op location replaced by
    an alias `#locN` defined after the module (MLIR prints them there and resolves them late)."""
    aliases: dict[str, str] = {}

    def alias(match: re.Match) -> str:
        name = aliases.setdefault(match.group(1), f"#loc{len(aliases) + 1}")
        return f"loc({name})"

    body = re.sub(r"loc\((\"[^\"]*\":\d+:\d+)\)$", alias, text, flags=re.MULTILINE)
    body = body.replace("builtin.module attributes", "module attributes", 1)
    return body + "".join(f"{name} = loc({loc})\n" for loc, name in aliases.items())


def test_printed_form_uses_builtin_integers_and_native_locations() -> None:
    text = print_mlir(program_to_module(parse(PPO_TEXT, "ppo.rpeg")))
    assert "#builtin.int" not in text and "#rpeg.loc" not in text
    assert re.search(r'"rpeg.workload"\(\) <\{B = 512 : i64, Lp = 128 : i64, Lr = 384 : i64, R = \d+ : i64, '
                     r'dtype = "\w+"\}> : \(\) -> \(\) loc\("ppo.rpeg":\d+:1\)', text)


def test_location_aliases_defined_after_the_module_resolve() -> None:
    program = parse(PPO_TEXT, "ppo.rpeg")
    text = mlir_opt_style(print_mlir(program_to_module(program)))
    assert "loc(#loc1)" in text and text.rstrip().splitlines()[-1].startswith("#loc")
    back = module_to_program(parse_mlir(make_context(), text, "ppo.opt.mlir"))
    assert back == program
    assert back.workload.loc == program.workload.loc != UNKNOWN_LOC
    assert [v.loc for v in back.graph.vertices] == [v.loc for v in program.graph.vertices]


def test_reprinting_mlir_opt_output_gives_the_same_text() -> None:
    text = print_mlir(program_to_module(parse(PPO_TEXT, "ppo.rpeg")))
    assert print_mlir(parse_mlir(make_context(), mlir_opt_style(text), "x.mlir")) == text


def test_escaped_non_ascii_file_names_read_back() -> None:
    program = parse(PPO_TEXT, "dür/ppo.rpeg")
    text = print_mlir(program_to_module(program))
    assert 'loc("d\\C3\\BCr/ppo.rpeg":' in text  # as MLIR escapes it too
    for form in (text, mlir_opt_style(text)):
        assert module_to_program(parse_mlir(make_context(), form, "x.mlir")).workload.loc.file == "dür/ppo.rpeg"


def test_ops_without_locations_read_back_unlocated() -> None:
    text = re.sub(r" loc\([^)]*\)$", "", print_mlir(program_to_module(parse(PPO_TEXT, "ppo.rpeg"))), flags=re.MULTILINE)
    back = module_to_program(parse_mlir(make_context(), text, "x.mlir"))
    assert back == parse(PPO_TEXT, "ppo.rpeg") and back.workload.loc == UNKNOWN_LOC


def test_a_bad_location_alias_is_located_at_its_own_line() -> None:
    text = mlir_opt_style(print_mlir(program_to_module(parse(PPO_TEXT, "ppo.rpeg"))))
    lines = text.splitlines()
    last = len(lines)
    lines[-1] = lines[-1].split("=")[0] + "= loc(\"a.rpeg\":x:1)"
    with pytest.raises(ParseError) as err:
        parse_mlir(make_context(), "\n".join(lines) + "\n", "x.mlir")
    assert f"x.mlir:{last}:" in str(err.value)


def test_an_undefined_location_alias_is_a_parse_error() -> None:
    text = mlir_opt_style(print_mlir(program_to_module(parse(PPO_TEXT, "ppo.rpeg"))))
    text = "\n".join(line for line in text.splitlines() if not line.startswith("#loc1 "))
    with pytest.raises(ParseError, match="#loc1"):
        parse_mlir(make_context(), text, "x.mlir")


def test_integers_beyond_64_bits_are_a_located_error() -> None:
    text = PPO_TEXT.replace("B = 512", "B = 9223372036854775808", 1)
    with pytest.raises(RpegError) as err:
        parse(text, "big.rpeg")
    assert "does not fit in 64 bits" in err.value.message
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "9223372036854775808" in row)
    assert err.value.loc.file == "big.rpeg" and err.value.loc.line == line
    assert isinstance(err.value.loc, Loc)
