"""Rollout generation: layout-independent seeded sampling, old log-probs, end-of-sequence masking, top-k/top-p
truncation as transformers' logits warpers define it."""

import pytest

torch = pytest.importorskip("torch")

from rpegc.core.ir.errors import RpegError  # noqa: E402
from rpegc.core.ir.program import Arch  # noqa: E402
from rpegc.runtime.backends.torch.model.generation import Sampling, expand_rollouts, generate, truncate  # noqa: E402
from rpegc.runtime.backends.torch.model.transformer import NetOptions, build_model  # noqa: E402
from rpegc.runtime.backends.torch.rl.step import response_forward  # noqa: E402

torch.set_num_threads(1)

ARCH = Arch(layers=2, hidden=32, ffn=64, vocab=16, heads=4, kv_heads=2)
LP, LR = 4, 6
MODEL = build_model(ARCH, "policy", 0, NetOptions(max_seq=LP + LR))
PROMPTS = expand_rollouts(torch.randint(0, ARCH.vocab, (4, LP), generator=torch.Generator().manual_seed(1)), 2)


def gen(rows, seed=5, step=3, **kw):
    return generate(MODEL, PROMPTS[rows], list(range(8))[rows] if isinstance(rows, slice) else rows.tolist(),
                    seed=seed, step=step, max_new_tokens=LR, **kw)


@pytest.mark.parametrize("shards", [2, 4])
def test_tokens_and_logprobs_do_not_depend_on_how_the_batch_is_split(shards):
    whole = gen(slice(0, 8), sampling=Sampling(temperature=1.3))
    size = 8 // shards
    parts = [gen(slice(i * size, (i + 1) * size), sampling=Sampling(temperature=1.3)) for i in range(shards)]
    assert torch.equal(torch.cat([p.sequences for p in parts]), whole.sequences)
    torch.testing.assert_close(torch.cat([p.logprobs for p in parts]), whole.logprobs, atol=1e-6, rtol=0)


def test_interleaved_shards_reproduce_the_same_sequences():
    whole = gen(slice(0, 8))
    odd = gen(torch.arange(1, 8, 2))
    assert torch.equal(odd.sequences, whole.sequences[1::2])


def test_rollouts_of_one_prompt_differ_and_seeds_and_steps_matter():
    a = gen(slice(0, 8))
    assert torch.equal(a.sequences[0, :LP], a.sequences[1, :LP])
    assert not torch.equal(a.responses[0], a.responses[1]) or not torch.equal(a.responses[2], a.responses[3])
    assert not torch.equal(gen(slice(0, 8), seed=6).responses, a.responses)
    assert not torch.equal(gen(slice(0, 8), step=4).responses, a.responses)
    assert torch.equal(gen(slice(0, 8)).responses, a.responses)


def test_old_logprobs_equal_a_teacher_forced_pass_over_the_sampled_tokens():
    roll = gen(slice(0, 8), sampling=Sampling(temperature=0.7))
    with torch.no_grad():
        forced = response_forward(MODEL, roll.sequences, LP, temperature=0.7).logprobs
    torch.testing.assert_close(roll.logprobs, forced, atol=1e-5, rtol=1e-5)
    assert roll.mask.eq(1).all() and roll.prompt_len == LP


def test_sequences_stop_after_end_of_sequence():
    eos, pad = 3, 0
    roll = gen(slice(0, 8), eos_id=eos, pad_id=pad)
    ended = 0
    for resp, mask, logp in zip(roll.responses, roll.mask, roll.logprobs):
        hits = (resp == eos).nonzero()
        length = int(hits[0]) + 1 if len(hits) else LR
        ended += length < LR
        assert mask.tolist() == [1.0] * length + [0.0] * (LR - length)
        assert resp[length:].eq(pad).all() and logp[length:].eq(0).all()
    assert ended > 0  # these seeds do end some sequences early, so the masking above was exercised


def test_bad_generation_requests_are_user_errors():
    with pytest.raises(RpegError, match="temperature"):
        gen(slice(0, 8), sampling=Sampling(temperature=0.0))
    with pytest.raises(RpegError, match="LM head"):
        generate(build_model(ARCH, "critic", 0, NetOptions(max_seq=LP + LR)), PROMPTS, range(8), seed=0, step=0,
                 max_new_tokens=LR)
    with pytest.raises(RpegError, match="max_seq"):
        generate(MODEL, PROMPTS, range(8), seed=0, step=0, max_new_tokens=LR + 1)


@pytest.mark.parametrize("args, message", [
    ((False, "critic", Sampling(), 4, 4, 16), "needs a model with an LM head"),
    ((True, "policy", Sampling(temperature=0.0), 4, 4, 16), "temperature must be > 0"),
    ((True, "policy", Sampling(top_p=0.0), 4, 4, 16), "top_p must lie in \\(0, 1\\]"),
    ((True, "policy", Sampling(top_p=1.5), 4, 4, 16), "top_p must lie in \\(0, 1\\]"),
    ((True, "policy", Sampling(top_k=-1), 4, 4, 16), "top_k must be >= 0"),
    ((True, "policy", Sampling(), 0, 4, 16), "max_new_tokens \\(Lr\\) must be >= 1"),
    ((True, "policy", Sampling(), 13, 4, 16), "Lp \\+ Lr = 4 \\+ 13 exceeds the model's max_seq 16"),
])
def test_each_generation_check_names_what_to_change(args, message):
    from rpegc.runtime.backends.torch.model.generation import check_generation

    with pytest.raises(RpegError, match=message):
        check_generation(*args)
    check_generation(True, "policy", Sampling(), 12, 4, 16)  # exactly max_seq fits


# A boundary case of top-p is a token whose cumulative probability lies within rounding of top_p; the two
# sides sum the same float64 probabilities in another order (transformers ascending, rpegc descending), each
# sum within V * 2^-53 relative of the exact one, so rows whose smallest distance to the boundary is above
# MARGIN = 1e-9 (>> 64 * 1.1e-16) are decided alike by both; the test requires its rows to be such.
MARGIN = 1e-9


@pytest.mark.parametrize("top_k, top_p", [(0, 0.9), (5, 1.0), (12, 0.7), (1, 1.0), (0, 0.3)])
def test_truncation_keeps_the_tokens_transformers_warpers_keep(top_k, top_p):
    warpers = pytest.importorskip("transformers.generation.logits_process")
    logits = 2.5 * torch.randn(64, 40, generator=torch.Generator().manual_seed(top_k + int(100 * top_p)),
                               dtype=torch.float64)
    theirs = logits.clone()
    if top_k:
        theirs = warpers.TopKLogitsWarper(top_k)(None, theirs)
    if top_p < 1:
        theirs = warpers.TopPLogitsWarper(top_p)(None, theirs)
        probs = torch.softmax(theirs, -1).sort(-1).values.cumsum(-1)
        assert (probs - (1 - top_p)).abs().min() > MARGIN  # no row sits on a rounding boundary
    ours = truncate(torch.softmax(logits, -1), Sampling(top_k=top_k, top_p=top_p))
    assert torch.equal(ours > 0, torch.isfinite(theirs))
    assert (ours > 0).sum(-1).min() >= 1


def test_truncated_draws_stay_in_the_kept_set_and_follow_its_renormalised_probabilities():
    from rpegc.runtime.backends.torch.model.generation import sample_tokens

    logp = torch.log_softmax(torch.randn(1, 12, generator=torch.Generator().manual_seed(3)), -1).expand(4000, 12)
    sampling = Sampling(top_k=6, top_p=0.8)
    kept = truncate(logp.double().exp(), sampling)[0]
    draws = sample_tokens(logp, [torch.Generator().manual_seed(i) for i in range(4000)], sampling)
    assert 1 < int((kept > 0).sum()) < 6 and kept[draws].gt(0).all()
    freq = torch.bincount(draws, minlength=12).double() / 4000
    # 4000 draws: each frequency within 5 standard deviations sqrt(p(1-p)/n) <= 0.008 of its probability
    assert (freq - kept / kept.sum()).abs().max() < 0.04


def test_top_k_one_is_greedy_and_the_recorded_logprobs_are_the_whole_tempered_distributions():
    greedy = gen(slice(0, 8), sampling=Sampling(top_k=1))
    with torch.no_grad():
        logits = MODEL(greedy.sequences[:, :-1]).logits[:, LP - 1:]
    assert torch.equal(greedy.responses, logits.argmax(-1))
    roll = gen(slice(0, 8), sampling=Sampling(temperature=1.5, top_k=6, top_p=0.8))
    with torch.no_grad():
        forced = response_forward(MODEL, roll.sequences, LP, temperature=1.5).logprobs
    torch.testing.assert_close(roll.logprobs, forced, atol=1e-5, rtol=1e-5)
