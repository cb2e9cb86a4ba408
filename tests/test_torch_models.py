"""Tiny transformers of the torch backend: heads per kind, seeded init, KV cache, stage slicing, weights."""

import pytest

torch = pytest.importorskip("torch")

from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.core.ir.program import Arch  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import (NetOptions, build_model, export_weights,  # noqa: E402
                                                install_weights)

torch.set_num_threads(1)

ARCH = Arch(layers=2, hidden=32, ffn=64, vocab=24, heads=4, kv_heads=2)  # GQA: 2 query heads per KV head
OPTS = NetOptions(max_seq=12)


def tokens(b=3, t=10, seed=0):
    return torch.randint(0, ARCH.vocab, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind, lm, scalar", [("policy", True, False), ("reference", True, False),
                                              ("critic", False, True), ("reward", False, True),
                                              ("actor_critic", True, True)])
def test_heads_follow_the_model_kind(kind, lm, scalar):
    out = build_model(ARCH, kind, 0, OPTS)(tokens())
    assert (out.logits is not None) == lm and (out.values is not None) == scalar
    if lm:
        assert out.logits.shape == (3, 10, ARCH.vocab)
    if scalar:
        assert out.values.shape == (3, 10)


def test_init_is_deterministic_and_the_backbone_ignores_the_heads():
    a = export_weights(build_model(ARCH, "policy", 7, OPTS))
    b = export_weights(build_model(ARCH, "policy", 7, OPTS))
    c = export_weights(build_model(ARCH, "policy", 8, OPTS))
    critic = export_weights(build_model(ARCH, "critic", 7, OPTS))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embed.weight"], c["embed.weight"])
    shared = [k for k in a if k in critic]
    assert "layers.1.attn.wq.weight" in shared and "lm_head.weight" not in shared
    assert all(torch.equal(a[k], critic[k]) for k in shared)


@pytest.mark.parametrize("mlp, positions", [("swiglu", "rope"), ("gelu", "learned")])
def test_kv_cache_decoding_equals_a_full_forward(mlp, positions):
    opts = NetOptions(max_seq=12, mlp=mlp, positions=positions)
    model = build_model(ARCH, "actor_critic", 3, opts).eval()
    seq = tokens(t=10)
    with torch.no_grad():
        full = model(seq)
        cache = model.new_cache(3)
        parts = [model(seq[:, :4], cache)] + [model(seq[:, t:t + 1], cache) for t in range(4, 10)]
    logits = torch.cat([p.logits for p in parts], dim=1)
    values = torch.cat([p.values for p in parts], dim=1)
    assert cache.length == 10
    torch.testing.assert_close(logits, full.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values, full.values, atol=1e-5, rtol=1e-5)


def test_causality_later_tokens_do_not_change_earlier_outputs():
    model = build_model(ARCH, "policy", 0, OPTS)
    seq = tokens(t=8)
    other = seq.clone()
    other[:, 5:] = (other[:, 5:] + 1) % ARCH.vocab
    with torch.no_grad():
        torch.testing.assert_close(model(seq).logits[:, :5], model(other).logits[:, :5])


def test_pipeline_stages_are_slices_of_layers():
    model = build_model(ARCH, "policy", 0, OPTS)
    seq = tokens()
    with torch.no_grad():
        h = model.forward_layers(model.embed_tokens(seq), first=0, last=1)
        h = model.forward_layers(h, first=1, last=2)
        torch.testing.assert_close(model.heads(h).logits, model(seq).logits)


def test_weights_round_trip_through_a_flat_dict():
    src, dst = build_model(ARCH, "critic", 1, OPTS), build_model(ARCH, "critic", 2, OPTS)
    weights = export_weights(src)
    assert all(isinstance(v, torch.Tensor) for v in weights.values())
    install_weights(dst, weights)
    seq = tokens()
    with torch.no_grad():
        assert torch.equal(src(seq).values, dst(seq).values)
    weights["value_head.weight"].add_(1.0)  # an exported version is a copy, not a view
    assert not torch.equal(weights["value_head.weight"], src.value_head.weight)


def test_installing_weights_of_another_model_is_rejected():
    policy = build_model(ARCH, "policy", 0, OPTS)
    with pytest.raises(RpegError, match="do not fit"):
        install_weights(policy, export_weights(build_model(ARCH, "critic", 0, OPTS)))
    wider = Arch(layers=2, hidden=32, ffn=96, vocab=24, heads=4, kv_heads=2)
    with pytest.raises(RpegError, match="shape"):
        install_weights(policy, export_weights(build_model(wider, "policy", 0, OPTS)))


@pytest.mark.parametrize("arch, opts, message", [
    (Arch(2, 30, 64, 24, 4, 4), OPTS, "not divisible by heads"),
    (Arch(2, 32, 64, 24, 4, 3), OPTS, "kv_heads"),
    (Arch(2, 12, 64, 24, 4, 4), OPTS, "even head dimension"),
    (ARCH, NetOptions(max_seq=12, mlp="relu"), "MLP kind"),
])
def test_unbuildable_architectures_say_what_to_change(arch, opts, message):
    with pytest.raises(RpegError, match=message):
        build_model(arch, "policy", 0, opts)


def test_sequences_longer_than_max_seq_are_rejected():
    model = build_model(ARCH, "policy", 0, OPTS)
    with pytest.raises(RpegError, match="max_seq"):
        model(tokens(t=13))


@pytest.mark.parametrize("layers", [1, 4, 6])
@pytest.mark.parametrize("kind", ["policy", "actor_critic"])
@pytest.mark.parametrize("recompute", ["interval", "full", "none"])
def test_training_recomputes_segments_and_its_gradients_are_those_of_no_recompute(layers, kind, recompute):
    """Training keeps only each segment's input (c = floor(sqrt(L)) layers, spec [A11], under recompute = interval;
    one layer under full) and recomputes the rest in the backward pass: the same operations on the same values, so
    every gradient is bit for bit the one without recompute (torch.utils.checkpoint is not used outside training,
    nor under recompute = none)."""
    arch = Arch(layers=layers, hidden=32, ffn=48, vocab=24, heads=4, kv_heads=2, gated=True)
    model = build_model(arch, kind, 3, OPTS)
    model.recompute = recompute
    x = tokens(seed=layers)
    calls = []
    def counted(h, rope, mask, a, b, cache=None, segment=model._segment):
        calls.append((a, b))
        return segment(h, rope, mask, a, b, cache)

    model._segment = counted
    grads = []
    for train in (True, False):
        model.zero_grad()
        model.train(train)
        out = model(x)
        loss = torch.log_softmax(out.logits, -1)[..., 0].sum() + (out.values.sum() if out.values is not None else 0)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    if recompute == "none":  # every layer at once, kept for the backward pass, and again in eval mode
        assert calls == [(0, layers), (0, layers)]
    else:
        c = max(1, int(layers ** 0.5)) if recompute == "interval" else 1
        segments = [(a, min(a + c, layers)) for a in range(0, layers, c)]
        # each segment forward, then recomputed in the backward pass (last first); in eval mode all layers at once
        assert calls == segments + segments[::-1] + [(0, layers)]
    assert all(torch.equal(grads[0][n], grads[1][n]) for n in grads[0])
