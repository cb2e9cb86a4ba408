"""Located errors of the `.rpeg` reader: every bad input is an RpegError at the offending token, with a
message that names what is wrong and what to write instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from rpegc.core.ir.errors import RpegError, RpegErrors, render
from rpegc.syntax.parser import parse

PPO = (Path(__file__).resolve().parent.parent / "examples" / "ppo.rpeg").read_text()
HEAD = "rpeg.workload {B = 8, R = 1, Lp = 4, Lr = 4}\n"
MODEL = 'rpeg.model @actor {arch = "tiny", kind = policy, trainable}\n'


def error_of(text: str) -> RpegError:
    with pytest.raises(RpegError) as info:
        parse(text, "bad.rpeg")
    return info.value


def position(text: str, needle: str, nth: int = 0) -> tuple[int, int]:
    """1-based (line, col) of the nth occurrence of `needle` in `text`."""
    index = -1
    for _ in range(nth + 1):
        index = text.index(needle, index + 1)
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def assert_at(err: RpegError, text: str, needle: str, *fragments: str, nth: int = 0) -> None:
    assert (err.loc.file, (err.loc.line, err.loc.col)) == ("bad.rpeg", position(text, needle, nth)), str(err)
    for fragment in fragments:
        assert fragment in err.message, err.message


CASES = [
    # (name, text, needle where the error points, message fragments)
    ("misspelt statement", PPO.replace("rpeg.vertex @ref_inf", "rpeg.vertx @ref_inf"), "rpeg.vertx",
     ["unexpected 'rpeg.vertx'", "'rpeg.vertex'", "did you mean 'rpeg.vertex'"]),
    ("missing comma", HEAD.replace("R = 1,", "R = 1") , "Lp",
     ["unexpected name 'Lp'", "one of ',', '}'"]),
    ("stray character", HEAD + MODEL.replace("policy", "policy$"), "$",
     ["unexpected '$'", "one of ',', '}'"]),
    ("unknown preset", HEAD + MODEL.replace('"tiny"', '"llama-9b"'), '"llama-9b"',
     ["unknown arch preset 'llama-9b'", "llama2-7b", "tiny-4l"]),
    ("missing arch fields", HEAD + "rpeg.model @m {layers = 2, hidden = 8, kind = critic}", "rpeg.model",
     ["needs ffn, vocab, heads", "kv_heads defaults to heads"]),
    ("unknown kind", HEAD + MODEL.replace("kind = policy", "kind = polcy"), "polcy",
     ["unknown kind 'polcy'", "policy, reference, critic, reward, actor_critic"]),
    ("unknown dtype", HEAD.replace("}", ", dtype = bf8}"), "bf8", ["unknown dtype 'bf8'", "bf16"]),
    ("unknown algorithm", PPO.replace("rpeg.data @gen -> @ref_inf", "rpeg.algorithm ppoo\n  rpeg.data @gen -> @ref_inf"),
     "ppoo", ["unknown algorithm 'ppoo'", "did you mean ppo?", "ppo, grpo, dpo"]),
    ("algorithm twice", PPO.replace("rpeg.data @gen -> @ref_inf",
                                    "rpeg.algorithm ppo\n  rpeg.algorithm grpo\n  rpeg.data @gen -> @ref_inf"),
     "rpeg.algorithm grpo", ["rpeg.algorithm is given twice", "keep one"]),
    ("unknown role", PPO.replace("inference  @ref", "infer @ref"), "infer @ref", ["unknown role 'infer'", "inference"]),
    ("unknown element kind", PPO.replace("rewards[B*R]", "reward[B*R]"), "reward[", ["unknown element kind 'reward'", "rewards"]),
    ("unknown size symbol", PPO.replace("tokens[B, Lp]", "tokens[B, L]"), "L]", ["unknown symbol 'L'", "B, R, Lp, Lr"]),
    ("undefined vertex", PPO.replace("rpeg.data @gen -> @ref_inf", "rpeg.data @gen -> @ref_in"), "@ref_in (",
     ["unknown vertex @ref_in", "did you mean @ref_inf"]),
    ("undefined container", PPO.replace("writes(%logp_ref)", "writes(%logp_rf)"), "%logp_rf",
     ["unknown container %logp_rf"]),
    ("undefined model", PPO.replace("rpeg.weights @reward", "rpeg.weights @rewrd"), "@rewrd", ["unknown model @rewrd"]),
    ("plan for another graph", PPO.replace("for @ppo", "for @grpo"), "@grpo", ["unknown graph @grpo", "for @ppo"]),
    ("plan on another cluster", PPO.replace("on @c64", "on @c8"), "@c8", ["unknown cluster @c8", "on @c64"]),
    ("duplicate model", PPO.replace('rpeg.model @ref    {', 'rpeg.model @actor  {'), "rpeg.model @actor", 
     ["model @actor is defined twice", "first at bad.rpeg:5:1"], 1),
    ("duplicate container", PPO.replace("%v        =", "%r        ="), "%r        =",
     ["container %r is defined twice"], 1),
    ("duplicate placement", PPO.replace("@reward_inf   at", "@ref_inf      at"), "@ref_inf      at",
     ["vertex @ref_inf is placed twice"], 1),
    ("second workload", PPO + HEAD, "rpeg.workload", ["at most one rpeg.workload", "bad.rpeg:3:1"], 1),
    ("second graph", PPO + "rpeg.graph @g {\n}\n", "rpeg.graph @g", ["at most one rpeg.graph"]),
    ("missing workload", MODEL, "rpeg.model", ["no rpeg.workload", "rpeg.workload {B = "]),
    ("zero batch", HEAD.replace("B = 8", "B = 0"), "0, R", ["'B' of rpeg.workload must be a positive integer, found 0"]),
    ("float rollouts", HEAD.replace("R = 1", "R = 1.5"), "1.5", ["'R' of rpeg.workload must be an integer"]),
    ("negative origin", PPO.replace("@gen          at (0, 0, 0)", "@gen          at (0, -8, 0)"), "-8",
     ["origin node of @gen must not be negative, found -8"]),
    ("zero tp", PPO.replace("tp = 2 mb = 8\n  @train_critic", "tp = 0 mb = 8\n  @train_critic"), "0 mb = 8",
     ["tp of the plan of @train_actor must be a positive integer, found 0"]),
    ("zero racks", PPO.replace("racks = 2", "racks = 0"), "0, nodes", ["'racks' of cluster @c64 must be a positive integer"]),
    ("unknown attribute", HEAD + MODEL.replace("trainable}", "trainabel}"), "trainabel",
     ["unknown attribute 'trainabel'", "did you mean trainable"]),
    ("negative staleness", PPO.replace("@actor = 0, @critic", "@actor = -1, @critic"), "-1",
     ["staleness budget of @actor must not be negative"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_located_error(case):
    name, text, needle, fragments, *nth = case
    err = error_of(text)
    first = err.errors[0] if isinstance(err, RpegErrors) else err
    assert_at(first, text, needle, *fragments, nth=nth[0] if nth else 0)


def test_end_of_input_points_after_the_last_token():
    text = PPO[: PPO.index("rpeg.cluster")].rstrip().rstrip("}")  # the graph's closing brace is missing
    err = error_of(text)
    line, col = position(text, "rpeg.algorithm ppo")
    assert (err.loc.line, err.loc.col) == (line, col + len("rpeg.algorithm ppo"))
    assert "unexpected end of input" in err.message and "'}'" in err.message and "'rpeg.vertex'" in err.message


def test_independent_errors_are_collected():
    text = PPO.replace("B = 512", "B = 0").replace("tokens[B, Lp]", "tokens[B, Lq]").replace("dp = 16", "dp = 0")
    err = error_of(text)
    assert isinstance(err, RpegErrors)
    assert [(e.loc.line, e.loc.col) for e in err.errors] == [
        position(text, "0, R"), position(text, "Lq"), position(text, "0 pp = 1 tp = 2")]
    rendered = render(err, text)
    assert rendered.count("bad.rpeg:") == 3 and "^" in rendered


def test_a_broken_definition_does_not_cascade():
    """A model with its own error is still declared: its users are not reported as unknown."""
    err = error_of(PPO.replace('"llama2-7b", kind = reference', '"llama2-9b", kind = reference'))
    assert not isinstance(err, RpegErrors) and "unknown arch preset" in err.message


def test_exec_errors_are_located():
    text = HEAD + MODEL + (
        "exec.graph @g steps = 1 {\n"
        "  exec.op @gen#0 generation @actor step 0 order 0 step 1\n"
        "  exec.op @gen#1 generation @actor order 0\n"
        "  exec.dep @gen#0 -> @gen#9\n"
        "  exec.comm @c0 step 0 order 0 version 2\n"
        "  exec.device 3 {peak = 1.0}\n"
        "}\n"
    )
    err = error_of(text)
    messages = [(e.loc.line, e.loc.col, e.message) for e in err.errors]
    assert messages[0][:2] == position(text, "step 1") and "gives 'step' twice" in messages[0][2]
    assert messages[1][:2] == position(text, "exec.op @gen#1") and "needs 'step N'" in messages[1][2]
    assert messages[2][:2] == position(text, "@gen#9") and "unknown exec node @gen#9" in messages[2][2]
    assert messages[3][:2] == position(text, "version 2") and "needs the model it moves" in messages[3][2]
    assert messages[4][:2] == position(text, "exec.device") and "needs an exec.memory line" in messages[4][2]


def test_binding_errors_are_located():
    text = HEAD + MODEL + (
        "exec.graph @g steps = 1 {\n"
        "  exec.op @gen#0 generation @actor step 0 order 0 reads {%Y phase 2, %Y phases 1 to 3}\n"
        "  exec.op @gen#1 generation @actor step 0 order 0 writes {%Y phases 3 to 3}\n"
        "  exec.op @gen#2 generation @actor step 0 order 0 reads {%Y} reads {@actor = 0}\n"
        "  exec.op @gen#3 generation @actor step 0 order 0 writes {%Y phase 0}\n"
        "}\n"
    )
    err = error_of(text)
    messages = [(e.loc.line, e.loc.col, e.message) for e in err.errors]
    assert messages[0][:2] == position(text, "%Y phases 1") and "%Y phase 2 appears twice in the reads" in messages[0][2]
    assert messages[1][:2] == position(text, "%Y phases 3") and "an empty or one-phase range" in messages[1][2]
    assert messages[2][:2] == position(text, "reads {@actor") and "gives 'reads' twice" in messages[2][2]
    assert messages[3][:2] == position(text, "0}\n}") and "phase of %Y" in messages[3][2]


@pytest.mark.parametrize("text", ["", "\x00\x01\x02", "rpeg.", "}}}", "exec.graph", "@", '%"\\q" = 1',
                                  "rpeg.workload {B = 1, R = 1, Lp = 1, Lr = 1} rpeg.model @\"\\x\" {kind = policy}",
                                  "rpeg.workload {B = " + "9" * 5000 + ", R = 1, Lp = 1, Lr = 1}",
                                  HEAD + "rpeg.graph @g {\n %x = rpeg.container tokens[" + "+".join(["B"] * 3000) + "]\n}"])
def test_garbage_is_a_located_error(text):
    err = error_of(text)
    for e in getattr(err, "errors", [err]):
        assert e.loc.file == "bad.rpeg" and e.loc.line >= 1 and e.loc.col >= 1
