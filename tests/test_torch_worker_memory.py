"""A worker holds only what the plan holds (issue 32, item 3): no whole version 0 (a rank draws or reads only its
pieces, and no whole model is built for shapes or for a pipeline stage), one serving copy (the serving module's
parameters are the weights entry's tensors, let go of when the entry is freed), and inference log-probs without
vocabulary-wide float32 copies of the whole microbatch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rpegc.core.ir.presets import lookup  # noqa: E402
from rpegc.core.ir.program import MODEL_KINDS, Arch, Workload  # noqa: E402
from rpegc.runtime.backends.torch.rl import step as rl  # noqa: E402
from rpegc.runtime.backends.torch.channel.commands import Op  # noqa: E402
from rpegc.runtime.backends.torch.controller.run_description import model_seed  # noqa: E402
from rpegc.runtime.backends.torch.parallel.layout import Layout, replica_rows  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import (NetOptions, TransformerModel, build_model,  # noqa: E402
                                                export_weights, param_shapes)
from rpegc.runtime.backends.torch.parallel.parallel_model import seeded_shard, shard_of  # noqa: E402
from rpegc.runtime.backends.torch.run_config import RunConfig, toy_rl_config  # noqa: E402
from rpegc.runtime.backends.torch.worker.process import ModelSpec, standalone_worker  # noqa: E402


@st.composite
def nets(draw) -> tuple[Arch, NetOptions]:
    kv = draw(st.integers(1, 2))
    heads = kv * draw(st.integers(1, 2))
    arch = Arch(layers=draw(st.integers(1, 4)), hidden=heads * 4, ffn=draw(st.integers(1, 12)),
                vocab=draw(st.integers(2, 20)), heads=heads, kv_heads=kv)
    net = NetOptions(max_seq=6, mlp=draw(st.sampled_from(("swiglu", "gelu"))),
                     positions=draw(st.sampled_from(("rope", "learned"))), qkv_bias=draw(st.booleans()))
    return arch, net


@settings(max_examples=40, deadline=None)
@given(nets(), st.sampled_from(MODEL_KINDS))
def test_parameter_shapes_are_computed_in_the_models_order(an, kind):
    arch, net = an
    built = [(n, tuple(p.shape)) for n, p in TransformerModel(arch, kind, net).named_parameters()]
    assert list(param_shapes(arch, kind, net).items()) == built


@settings(max_examples=25, deadline=None)
@given(nets(), st.sampled_from(MODEL_KINDS), st.data())
def test_a_stage_builds_only_its_own_parameters(an, kind, data):
    arch, net = an
    first = data.draw(st.integers(0, arch.layers - 1))
    last = data.draw(st.integers(first + 1, arch.layers))
    embeds, ends = data.draw(st.booleans()), data.draw(st.booleans())
    stage = TransformerModel(arch, kind, net, stage=(first, last, embeds, ends))
    whole = dict(param_shapes(arch, kind, net))

    def belongs(name: str) -> bool:
        if name.startswith("layers."):
            return first <= int(name.split(".")[1]) < last
        return embeds if name.startswith(("embed.", "pos_embed.")) else ends

    assert {n: tuple(p.shape) for n, p in stage.named_parameters()} == {n: s for n, s in whole.items() if belongs(n)}


@pytest.mark.parametrize("dp,pp,tp", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 2)])
def test_a_rank_draws_exactly_its_pieces_of_version_0(dp, pp, tp):
    arch = lookup("tiny-4l")
    net = NetOptions(max_seq=8)
    layout = Layout(tuple(range(dp * pp * tp)), dp, pp, tp)
    shapes = param_shapes(arch, "actor_critic", net)
    whole = export_weights(build_model(arch, "actor_critic", 7, net))
    for rank in layout.ranks:
        drawn = seeded_shard(shapes, layout, rank, arch.layers, 7, net.init_std)
        want = shard_of(whole, shapes, layout, rank, arch.layers)
        assert drawn.keys() == want.keys()
        assert all(torch.equal(drawn[n], want[n]) for n in want)


SINGLE = Layout((0,), 1, 1, 1)
B, R, LP, LR = 4, 2, 4, 5


def _worker():
    arch = lookup("tiny")
    run = RunConfig(algorithm="grpo", actor=arch, workload=Workload(B=B, R=R, Lp=LP, Lr=LR, dtype="bf16"),
                    rl=toy_rl_config("grpo"))
    models = {"ref": ModelSpec("ref", "reference", arch, model_seed(0, "reference"))}
    worker = standalone_worker(run, models, device=torch.device("cpu"))
    worker.install("W:ref", "ref", SINGLE)
    return worker


def _inference(worker, label: str) -> None:
    worker.holdings.entries["rollouts"] = worker.holdings.entries.get("rollouts") or _rollouts()
    worker.execute(Op(node="ref_inf", tag=0, ranks=list(SINGLE.ranks), step=0, role="inference", model="ref",
                      layout=SINGLE, mb=2, rows=replica_rows(SINGLE, 0, B * R), weights=label, inputs=["rollouts"],
                      outputs={"out": ["ref_logprobs"]}, fields=["ref_logprobs"], prep=[], output=None,
                      version_out=None))


def _rollouts():
    from rpegc.runtime.backends.torch.worker.holdings import Entry, Piece

    seqs = torch.randint(0, lookup("tiny").vocab, (B * R, LP + LR), generator=torch.Generator().manual_seed(1))
    return Entry("data", pieces=[Piece(0, B * R, {"sequences": seqs, "mask": torch.ones(B * R, LR)})])


def test_the_serving_module_is_the_weights_entry():
    worker = _worker()
    entry = worker.entry("W:ref")
    _inference(worker, "W:ref")
    (pm,) = worker.holdings.serving.values()
    params = pm.params()
    assert all(params[n].data_ptr() == t.data_ptr() for n, t in entry.shards.items())  # one copy, not two
    held = sum(e.nbytes() for e in worker.holdings.entries.values())
    assert worker.memory() == held  # the module's parameters are counted once, with the entry
    worker.holdings.free(["W:ref"])
    assert pm.bound is None and all(p.numel() == 0 for p in pm.module.parameters())  # nothing stale kept alive
    # a copy of the same version under another label is bound afresh
    worker.install("W:ref2", "ref", SINGLE)
    _inference(worker, "W:ref2")
    assert pm.bound == "W:ref2"
    assert all(pm.params()[n].data_ptr() == t.data_ptr() for n, t in worker.entry("W:ref2").shards.items())


def test_replacing_an_entry_lets_the_module_go_of_the_old_tensors():
    worker = _worker()
    _inference(worker, "W:ref")
    (pm,) = worker.holdings.serving.values()
    worker.install("W:ref", "ref", SINGLE)  # the same label again
    assert pm.bound is None
    _inference(worker, "W:ref")
    assert all(pm.params()[n].data_ptr() == t.data_ptr() for n, t in worker.entry("W:ref").shards.items())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_log_probs_in_pieces_are_those_of_the_whole(monkeypatch, dtype):
    """Each row's log-softmax is computed alone whatever the rows beside it, so the pieces' values are bit for
    bit the whole batch's (here on a response slice of the logits, as response_forward reads them)."""
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(7, 9, 50, generator=gen) * 4).to(dtype)[:, 3:]
    tokens = torch.randint(0, 50, (7, 6), generator=gen)
    whole = rl.token_logprobs(logits, tokens, 0.7)
    monkeypatch.setattr(rl, "LOGPROB_PIECE", 2 * 6 * 50)  # two sequences a piece
    pieces = rl.token_logprobs(logits, tokens, 0.7)
    assert pieces.dtype == torch.float32 and torch.equal(pieces, whole)
    tracked = logits.float().requires_grad_(True)
    assert rl.token_logprobs(tracked, tokens, 0.7).requires_grad  # autograd's path stays whole and tracked
