"""End-to-end tests on tiny random models built in the test (no downloads, fp32, seconds).

The native runtime is checked against transformers itself; the engine's speculative paths are
checked against plain decoding with the same runtime, token for token.
"""
from __future__ import annotations

import pytest
import torch

from _tiny import VOCAB, ByteTokenizer, FakeTokenizer, build_hf, load_native, perturbed, save
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.drafters import DrafterContext, build_drafter
from specdraft.engine import DRAFT, Detokenizer, Engine, _partial_stop
from specdraft.errors import ContextLengthError, ParameterError
from specdraft.models.hf import HFModel
from specdraft.models.llama import LlamaModel

PROMPT = [5, 17, 33, 2, 5, 17, 33, 8, 41, 5, 17, 60, 3, 5, 17, 33]  # repetitive: prompt lookup finds n-grams
GREEDY = SamplingConfig()
SAMPLED = SamplingConfig(temperature=1.0, seed=1234)


# ------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """HF reference modules and their saved directories."""
    root = tmp_path_factory.mktemp("tiny")
    target = build_hf("qwen2", seed=0)
    near = perturbed(target, seed=7, noise=0.01)  # a draft that mostly agrees with the target
    other = build_hf("qwen2", seed=1)  # an unrelated draft: mostly rejected
    llama_tied = build_hf("llama", seed=2, tie=True)
    qwen3 = build_hf("qwen3", seed=3)
    return {
        "qwen3": (qwen3, save(qwen3, root / "qwen3")),
        "target": (target, save(target, root / "target")),
        "near": (near, save(near, root / "near")),
        "other": (other, save(other, root / "other")),
        "llama-tied": (llama_tied, save(llama_tied, root / "llama-tied")),
    }


@pytest.fixture(scope="module")
def target(models):
    return load_native(models["target"][1])


@pytest.fixture(scope="module")
def drafts(models):
    """Native draft models, each its own instance (the target's twin too)."""
    return {name: load_native(models[name][1]) for name in ("target", "near", "other")}


def make_engine(target_model, method="none", draft_model=None, eos=(), **spec_kw):
    # Tiny random models: let every n-gram match propose and never cut drafts short, so the
    # speculative path runs on every step (the library's defaults are tuned for real models).
    spec_kw.setdefault("ngram_min", 1)
    spec_kw.setdefault("min_confidence", 0.0)
    spec_kw.setdefault("cost_rule", False)  # a tiny model's forward times would cut every draft
    spec = SpecConfig(method=method, **spec_kw)
    drafter = None
    if method != "none":
        drafter = build_drafter(method, DrafterContext(spec=spec, target=target_model, draft_model=draft_model))
    return Engine(target_model, FakeTokenizer(), drafter, spec, eos_ids=set(eos))


def run(engine, prompt=PROMPT, sampling=GREEDY, **gen_kw):
    gen = GenerationConfig(**{"max_new_tokens": 40, **gen_kw})
    text, pieces = engine.generate(prompt, sampling, gen)
    return text, pieces, list(engine.token_ids), engine.stats


def assert_speculated(stats):
    assert stats.drafts > 0 and stats.draft_tokens > 0, stats
    assert stats.accepted_tokens <= stats.draft_tokens


@pytest.fixture(scope="module")
def plain(target):
    """Plain greedy decoding: text and tokens of the reference run (no EOS, 40 tokens)."""
    text, pieces, ids, stats = run(make_engine(target))
    assert stats.drafts == 0 and stats.draft_tokens == 0
    return text, ids


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


# ------------------------------------------------------------------------------------ runtime

@pytest.mark.parametrize("name", ["target", "llama-tied", "qwen3"])
def test_native_logits_equal_transformers(models, name):
    hf, path = models[name]
    native = load_native(path)
    out = native.forward(torch.tensor(PROMPT))
    assert out.logits.dtype == torch.float32 and out.logits.shape == (len(PROMPT), VOCAB)
    torch.testing.assert_close(out.logits, hf_logits(hf, PROMPT), atol=1e-4, rtol=0)
    assert native.length == len(PROMPT)


def test_native_chunked_forward_equals_one_forward(models, target):
    hf, _ = models["target"]
    ref = hf_logits(hf, PROMPT)
    target.reset()
    rows = []
    at = 0
    for size in (5, 1, 4, 1, 2, 3):
        rows.append(target.forward(torch.tensor(PROMPT[at:at + size])).logits)
        at += size
    assert at == len(PROMPT) and target.length == len(PROMPT)
    torch.testing.assert_close(torch.cat(rows), ref, atol=1e-4, rtol=0)


def test_native_last_only_and_hidden(models, target):
    hf, _ = models["target"]
    target.reset()
    out = target.forward(torch.tensor(PROMPT), last_only=True, need_hidden=True)
    # logits of the last row only; hidden states of every row (feature drafters cache them all)
    assert out.logits.shape == (1, VOCAB) and out.hidden.shape == (len(PROMPT), 64)
    torch.testing.assert_close(out.logits[0], hf_logits(hf, PROMPT)[-1], atol=1e-4, rtol=0)
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT]), output_hidden_states=True).hidden_states[-1][0]
    torch.testing.assert_close(out.hidden, ref, atol=1e-4, rtol=0)


def test_native_rollback_then_new_tokens(models, target):
    hf, _ = models["target"]
    target.reset()
    target.forward(torch.tensor(PROMPT))
    target.rollback(7)
    assert target.length == 7
    new = [70, 71, 72, 73]
    out = target.forward(torch.tensor(new))
    torch.testing.assert_close(out.logits, hf_logits(hf, PROMPT[:7] + new)[7:], atol=1e-4, rtol=0)
    # Rolling back to the current length is a no-op; beyond it is an error.
    target.rollback(target.length)
    with pytest.raises(ValueError):
        target.rollback(target.length + 1)
    with pytest.raises(ValueError):
        target.rollback(-1)
    target.reset()
    assert target.length == 0
    torch.testing.assert_close(target.forward(torch.tensor(PROMPT[:3])).logits, hf_logits(hf, PROMPT[:3]),
                               atol=1e-4, rtol=0)


def test_native_tree_forward_and_compact(models, target):
    """Two branches verified in one forward; compact() keeps one branch next to the prefix."""
    hf, _ = models["target"]
    prefix = PROMPT[:10]
    target.reset()
    target.forward(torch.tensor(prefix))
    L0 = target.length
    # nodes: 0:a  1:b1(parent 0)  2:c1(parent 1)  3:b2(parent 0)  4:c2(parent 3)
    tokens = [20, 21, 22, 23, 24]
    parents = [-1, 0, 1, 0, 3]
    depth = [0, 1, 2, 1, 2]
    mask = torch.zeros(5, 5, dtype=torch.bool)
    for i in range(5):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    out = target.forward(torch.tensor(tokens), positions=torch.tensor([L0 + d for d in depth]), tree_mask=mask)
    ref_b1 = hf_logits(hf, prefix + [20, 21, 22])[L0:]
    ref_b2 = hf_logits(hf, prefix + [20, 23, 24])[L0:]
    torch.testing.assert_close(out.logits[[0, 1, 2]], ref_b1, atol=1e-4, rtol=0)
    torch.testing.assert_close(out.logits[[0, 3, 4]], ref_b2, atol=1e-4, rtol=0)
    # Keep the second branch: rows L0, L0+3, L0+4 move to L0, L0+1, L0+2.
    before_k = [k[:, [L0, L0 + 3, L0 + 4]].clone() for k in target.k_cache]
    before_v = [v[:, [L0, L0 + 3, L0 + 4]].clone() for v in target.v_cache]
    prefix_k = [k[:, :L0].clone() for k in target.k_cache]
    target.compact(L0, torch.tensor([L0, L0 + 3, L0 + 4]))
    assert target.length == L0 + 3
    for i in range(len(target.k_cache)):
        assert torch.equal(target.k_cache[i][:, L0:L0 + 3], before_k[i])
        assert torch.equal(target.v_cache[i][:, L0:L0 + 3], before_v[i])
        assert torch.equal(target.k_cache[i][:, :L0], prefix_k[i])
    # Decoding continues as if the kept branch had been fed as a chain.
    out = target.forward(torch.tensor([25, 26]))
    torch.testing.assert_close(out.logits, hf_logits(hf, prefix + [20, 23, 24, 25, 26])[-2:], atol=1e-4, rtol=0)


@pytest.mark.parametrize("keep", [[0, 1, 2], [0, 1, 4], [0, 2, 3], [1, 2], [3, 4], [0], [2]])
def test_compact_moves_only_what_is_out_of_place(target, keep):
    """compact() leaves rows already in place and moves the rest: the cache afterwards is what
    copying every kept row would give, whichever prefix of the kept rows sits in place."""
    target.reset()
    target.forward(torch.tensor(PROMPT[:12]))
    L0 = 7
    rows = torch.tensor([L0 + r for r in keep])
    want_k = [torch.cat([k[:, :L0], k[:, rows]], dim=1).clone() for k in target.k_cache]
    want_v = [torch.cat([v[:, :L0], v[:, rows]], dim=1).clone() for v in target.v_cache]
    target.compact(L0, rows)
    assert target.length == L0 + len(keep)
    for i in range(len(target.k_cache)):
        assert torch.equal(target.k_cache[i][:, :target.length], want_k[i])
        assert torch.equal(target.v_cache[i][:, :target.length], want_v[i])


def test_native_cache_overflow_raises(models):
    small = load_native(models["target"][1], max_length=8)
    assert small.max_length == 8
    small.forward(torch.tensor(PROMPT[:8]))
    with pytest.raises(ValueError):
        small.forward(torch.tensor([1]))


# ------------------------------------------------------------------------------------ greedy equality

@pytest.mark.parametrize("method, draft, k", [
    ("draft-model", "near", 4),
    ("draft-model", "other", 4),
    ("draft-model", "target", 5),
    ("draft-model", "near", 1),
    ("prompt-lookup", None, 4),
    ("prompt-lookup", None, 8),
    ("hybrid", "near", 4),
    ("hybrid", "other", 3),
])
def test_greedy_speculative_equals_plain(target, drafts, plain, method, draft, k):
    engine = make_engine(target, method, drafts[draft] if draft else None, k=k)
    text, pieces, ids, stats = run(engine)
    assert ids == plain[1]
    assert text == plain[0]
    assert_speculated(stats)
    assert stats.new_tokens == len(ids) == 40
    # Every token is a Piece with an origin; accepted draft tokens are marked as such.
    assert [p.token_id for p in pieces] == ids
    assert sum(p.origin == DRAFT for p in pieces) == stats.accepted_tokens
    assert stats.step_tokens >= stats.new_tokens - 1
    if draft == "near":
        assert stats.accepted_tokens > 0  # the near draft agrees often
    if draft == "other":
        assert stats.acceptance_rate < 1.0  # and the unrelated one gets rejected


def test_draft_equal_to_target_accepts_everything(target, drafts, plain):
    engine = make_engine(target, "draft-model", drafts["target"], k=4, trees=False)  # chains
    text, pieces, ids, stats = run(engine)
    assert ids == plain[1]
    assert_speculated(stats)
    assert stats.acceptance_rate == 1.0
    assert stats.acceptance_by_position == [1.0] * 4
    # 1 token from the prefill, then k + 1 per forward (the last step shorter: max tokens).
    assert stats.target_forwards == -(-(40 - 1) // 5)
    assert stats.mean_accepted_tokens > 4.0


def test_min_confidence_drafting_is_still_lossless(target, drafts, plain):
    engine = make_engine(target, "draft-model", drafts["near"], k=6, min_confidence=0.6)
    _, _, ids, stats = run(engine)
    assert ids == plain[1]
    assert_speculated(stats)


class ScriptedLM:
    """A CausalLM whose next-token distribution after n tokens is scripted: token n + 1 with
    probability probs[n] (the rest spread evenly). Counts forwards."""

    def __init__(self, probs: list[float], vocab: int = 50):
        self.probs, self.vocab, self.max_length = probs, vocab, 1000
        self.length = self.forwards = 0

    def forward(self, ids, last_only=False, **_):
        from specdraft.models.base import ModelOutput

        self.forwards += 1
        self.length += int(ids.shape[0])
        p = self.probs[min(self.length, len(self.probs) - 1)]
        row = torch.full((self.vocab,), (1.0 - p) / (self.vocab - 1))
        row[(self.length + 1) % self.vocab] = p
        return ModelOutput(logits=row.log()[None], hidden=None)

    def rollback(self, length):
        self.length = length

    def reset(self):
        self.length = 0


def test_draft_stops_forwarding_once_it_doubts_its_guesses():
    from specdraft.drafters.draft_model import DraftModel

    # After the 4-token context the draft is 0.9, 0.7, 0.4, 0.9 sure of its next guesses.
    lm = ScriptedLM([0.9] * 4 + [0.9, 0.7, 0.4, 0.9, 0.9])
    drafter = DraftModel(lm, min_confidence=0.5)
    drafter.begin([1, 2, 3, 4])
    draft = drafter.propose([1, 2, 3, 4], 6, GREEDY, torch.Generator())
    # 0.9 -> 0.63 -> 0.252 < 0.5: the third guess is proposed, but no forward is run for a fourth
    assert draft.tokens == [5, 6, 7]
    assert lm.forwards == 1 + 2  # the catch-up forward, then one per further guess
    lm.forwards = 0
    drafter = DraftModel(lm, min_confidence=0.0)  # off: always k guesses
    drafter.begin([1, 2, 3, 4])
    assert len(drafter.propose([1, 2, 3, 4], 6, GREEDY, torch.Generator())) == 6 and lm.forwards == 6


def test_draft_forward_cost_ignores_the_prompt_catch_up():
    """The cost of a draft forward (what the cost rule charges a guess) is timed on forwards of a
    step's 1-2 tokens, never on the catch-up over the prompt (seconds for a long prompt)."""
    from specdraft.drafters.draft_model import DraftModel

    lm = ScriptedLM([0.9] * 20)
    drafter = DraftModel(lm, min_confidence=0.0)
    drafter.begin([1, 2, 3, 4])
    drafter.propose([1, 2, 3, 4], 1, GREEDY, torch.Generator())  # feeds the 4 prompt tokens only
    assert drafter.forward_seconds == 0.0
    drafter.propose([1, 2, 3, 4, 5, 6], 2, GREEDY, torch.Generator())  # 2 new tokens, then one guess forward
    assert drafter.forward_seconds > 0.0 and lm.forwards == 3


def test_a_draft_model_says_what_of_a_proposal_was_catching_up(monkeypatch):
    """Feeding more than a step's 1-2 tokens (the prompt, or the steps it did not draft) is catching
    up, less what a step's forward costs; a step's own feeding is not (the payoff leaves it out)."""
    from types import SimpleNamespace

    from specdraft.drafters import draft_model
    from specdraft.drafters.draft_model import DraftModel

    lm = ScriptedLM([0.9] * 40)
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(draft_model, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    forward = lm.forward

    def timed(ids, **kw):  # a forward of n tokens takes n seconds
        clock.now += int(ids.shape[0])
        return forward(ids, **kw)

    lm.forward = timed
    drafter = DraftModel(lm, min_confidence=0.0)
    drafter.begin([1, 2, 3, 4])
    drafter.propose([1, 2, 3, 4], 1, GREEDY, torch.Generator())
    assert drafter.catch_up_seconds == 4.0  # the prompt, no step timed yet
    drafter.propose([1, 2, 3, 4, 5, 6], 2, GREEDY, torch.Generator())  # a step's 2 tokens, one guess forward
    assert drafter.catch_up_seconds == 0.0
    step = drafter.forward_seconds
    assert 1.0 <= step <= 2.0
    drafter.observe(list(range(1, 8)), 0)  # its guesses rejected: it holds the 6 tokens before them
    drafter.propose(list(range(1, 12)), 1, GREEDY, torch.Generator())  # 5 tokens it did not see
    assert drafter.catch_up_seconds == pytest.approx(5.0 - step)


def draft_forwards_take(engine, seconds: float, monkeypatch) -> None:
    """The draft model's forwards, as its drafter times them, take exactly ``seconds`` each: its
    clock (the drafter module's ``time``) moves only when the model runs, so what the cost rule
    decides does not hang on how fast or loaded the machine is."""
    from types import SimpleNamespace

    from specdraft.drafters import draft_model

    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(draft_model, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    if not seconds:
        # the clock stands still; the model keeps its own forward (a copy made by with_cache
        # would carry a patched one, bound to this model's cache)
        return
    forward = engine.drafter.model.forward  # (the fixture's model: patched for this test only)

    def timed(*args, **kwargs):
        clock.now += seconds
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.drafter.model, "forward", timed)


def fixed_costs(per_token: float):
    """Forward costs where each extra token of a block costs ``per_token`` one-token forwards,
    kept fixed while generating."""
    from specdraft.costs import ForwardCosts

    return ForwardCosts.fixed({t: 1 + per_token * (t - 1) for t in range(2, 12)}, 0.005)


@pytest.mark.parametrize("per_token, draft_seconds, expect_drafts", [
    (1.0, 0.0, False),  # a block costs a forward per token: no guess pays
    (0.0, 0.0, True),  # verification and drafting free: every guess is sent
    (0.0, 0.01, True),  # a draft forward costs 2 target forwards: the first guess (free) still goes
])
def test_cost_aware_draft_model_stays_exact(target, drafts, plain, per_token, draft_seconds, expect_drafts,
                                           monkeypatch):
    """Greedy drafts of the draft model cut by cost (as the head's): exact whatever the costs,
    no guesses where none pays (but the exploring ones; after its warm-up the draft model is
    skipped), one guess a step where only the first one is free."""
    from specdraft.costs import ForwardCosts, PassRates

    e = make_engine(target, "draft-model", drafts["near"], k=4, cost_rule=True, trees=False)  # chains
    costs = fixed_costs(per_token)
    e.costs = e.policy.costs = costs
    draft_forwards_take(e, draft_seconds, monkeypatch)
    text, _, tokens, stats = run(e)
    assert tokens == plain[1] and text == plain[0]
    if expect_drafts:
        assert stats.draft_tokens > 0, stats.summary()
    else:  # only the exploring guesses: one in EXPLORE of the drafts cut to nothing is sent
        assert stats.draft_tokens <= stats.target_forwards // ForwardCosts.EXPLORE, stats.summary()
    rates, prior = e.drafter.rates, PassRates()
    assert sum(rates.passed) - sum(prior.passed) == pytest.approx(stats.accepted_tokens)
    if not expect_drafts:
        payoff = e.policy.payoff(e.drafter)
        assert payoff.skipped > 0 and payoff.steps < stats.target_forwards
    elif draft_seconds:
        # one guess a step, but for the first step: no draft forward was timed before it
        assert stats.drafts > 10 and stats.draft_tokens <= stats.drafts + 3


@pytest.mark.parametrize("draft_seconds", [0.0, 0.01])
def test_sampled_draft_model_drafts_are_cut_by_cost(target, drafts, draft_seconds, monkeypatch):
    """Sampled draft-model chains follow the cost rule too: each guess rated by its probability
    under q, calibrated in a table of its own (q_rates: how often the verifier kept such guesses);
    with free checks and drafting whole drafts go, with a draft forward costing 2 target forwards
    one guess a step (the first is free). The greedy table learns nothing from them."""
    from specdraft.costs import PassRates

    e = make_engine(target, "draft-model", drafts["near"], k=4, cost_rule=True, trees=False)
    e.costs = e.policy.costs = fixed_costs(0.0)
    draft_forwards_take(e, draft_seconds, monkeypatch)
    _, _, tokens, stats = run(e, sampling=SamplingConfig(temperature=0.8, seed=3))
    assert_speculated(stats)
    prior = PassRates()
    assert e.drafter.rates.passed == prior.passed and e.drafter.rates.tried == prior.tried
    assert sum(e.drafter.q_rates.passed) - sum(prior.passed) == pytest.approx(stats.accepted_tokens)
    if draft_seconds:
        assert stats.draft_tokens <= stats.drafts + 3
    else:
        assert stats.draft_tokens > 2 * stats.drafts


@pytest.mark.parametrize("draft, cost_rule, trees", [("target", False, True), ("near", False, True), ("near", True, True),
                                                    ("near", False, False), ("other", False, False)])
def test_draft_model_trees_are_exact_and_keep_the_accepted_rows(target, drafts, plain, draft, cost_rule, trees,
                                                                monkeypatch):
    """Greedy draft-model drafts as dynamic trees (and as chains): exact; trees really branch; the
    likeliest first guess is always checked (a draft equal to the target passes it every step);
    after each verification the draft cache holds exactly the committed tokens it has fed, a
    prefix of the context (a chain's accepted guesses kept by count, a tree's accepted path's rows
    compacted next to the context), as a fresh cache fed them in one block would."""
    e = make_engine(target, "draft-model", drafts[draft], k=4, cost_rule=cost_rule, trees=trees)
    if cost_rule:
        e.costs = e.policy.costs = fixed_costs(0.0)  # checks free: every guess pays
        draft_forwards_take(e, 0.0, monkeypatch)  # and drafting too, however loaded the machine
    drafter = e.drafter
    proposals, caches = [], []
    propose, observe = drafter.propose, drafter.observe

    def spy_propose(*a, **kw):
        proposals.append(d := propose(*a, **kw))
        return d

    def spy_observe(context, n):
        observe(context, n)
        caches.append((list(drafter.seq), drafter.model.length, [k[:, :drafter.model.length].clone()
                                                                  for k in drafter.model.k_cache]))

    monkeypatch.setattr(drafter, "propose", spy_propose)
    monkeypatch.setattr(drafter, "observe", spy_observe)
    text, _, ids, stats = run(e)
    assert ids == plain[1] and text == plain[0]
    assert_speculated(stats)
    branching = any(d.parents is not None and len(set(d.parents)) < len(d.parents) for d in proposals)  # siblings
    assert branching == trees
    if draft == "target":
        assert stats.accepted_tokens >= stats.drafts
    prompt = list(PROMPT)
    fresh = drafter.model.with_cache(drafter.model.max_length)
    for seq, length, k_cache in caches:
        assert len(seq) == length and seq == (prompt + ids)[:length]
        fresh.reset()
        fresh.forward(torch.tensor(seq))
        for got, want in zip(k_cache, fresh.k_cache):
            torch.testing.assert_close(got, want[:, :length], rtol=1e-4, atol=1e-5)


def test_draft_model_with_a_smaller_context_than_the_target(models, target, plain):
    # The draft's cache fills up mid-generation; from then on the engine decodes without drafts.
    short_draft = load_native(models["near"][1], max_length=len(PROMPT) + 12)
    engine = make_engine(target, "draft-model", short_draft, k=4)
    _, _, ids, stats = run(engine)
    assert ids == plain[1]
    assert_speculated(stats)
    assert stats.target_forwards > stats.drafts  # some steps had no draft


def test_hybrid_uses_both_prophets(target, drafts, plain):
    engine = make_engine(target, "hybrid", drafts["near"], k=4)
    _, _, ids, stats = run(engine)
    assert ids == plain[1]
    assert_speculated(stats)
    hybrid = engine.drafter
    assert hybrid.copied > 0 and hybrid.modelled > 0  # tiny models repeat themselves, and not always
    assert hybrid.copied + hybrid.modelled == stats.drafts


@pytest.mark.parametrize("method", ["draft-model", "hybrid"])
def test_draft_window_is_lossless_and_bounds_the_draft_cache(target, drafts, plain, method):
    draft = drafts["near"]
    engine = make_engine(target, method, draft, k=4, draft_window=3)
    _, _, ids, stats = run(engine)
    assert ids == plain[1]
    assert_speculated(stats)
    # the draft saw the prompt's last 3 tokens and what came after, never the whole prompt
    assert draft.length <= 3 + len(ids)


def test_engine_is_reusable(target, drafts, plain):
    engine = make_engine(target, "draft-model", drafts["near"], k=4)
    first = run(engine)[2]
    other_prompt = run(engine, prompt=[9, 8, 7, 6, 5, 4, 3, 2], max_new_tokens=10)[2]
    again = run(engine)[2]
    assert first == again == plain[1]
    plain_other = run(make_engine(target), prompt=[9, 8, 7, 6, 5, 4, 3, 2], max_new_tokens=10)[2]
    assert other_prompt == plain_other


# ------------------------------------------------------------------------------------ stopping

METHODS = [("none", None), ("draft-model", "target"), ("draft-model", "near"), ("prompt-lookup", None),
           ("hybrid", "near")]


@pytest.mark.parametrize("method, draft", METHODS)
def test_eos_stops_generation(target, drafts, plain, method, draft):
    ids = plain[1]
    # An EOS id that first appears some way into the plain output (it may be inside a draft).
    cut = next(i for i in range(8, len(ids)) if ids[i] not in ids[:i])
    eos = ids[cut]
    engine = make_engine(target, method, drafts[draft] if draft else None, eos=(eos,), k=4)
    text, pieces, got, stats = run(engine)
    assert got == ids[:cut]  # EOS itself is not part of the output
    assert text == FakeTokenizer().decode(ids[:cut])
    assert stats.new_tokens == cut
    if method != "none":
        assert_speculated(stats)
    # ignore_eos keeps going to max_new_tokens
    _, _, got, _ = run(engine, ignore_eos=True)
    assert got == ids


def test_eos_as_the_first_token(target, plain):
    engine = make_engine(target, eos=(plain[1][0],))
    text, pieces, ids, stats = run(engine)
    assert ids == [] and text == "" and pieces == [] and stats.new_tokens == 0


@pytest.mark.parametrize("method, draft", METHODS)
@pytest.mark.parametrize("n", [1, 2, 3, 6, 13])
def test_max_new_tokens_is_exact(target, drafts, plain, method, draft, n):
    engine = make_engine(target, method, drafts[draft] if draft else None, k=4)
    text, pieces, ids, stats = run(engine, max_new_tokens=n)
    assert ids == plain[1][:n]
    assert len(pieces) == n and stats.new_tokens == n
    assert target.length <= len(PROMPT) + n


def test_context_length_errors(target):
    engine = make_engine(target)
    with pytest.raises(ContextLengthError):
        run(engine, max_new_tokens=target.max_length - len(PROMPT) + 1)
    with pytest.raises(ContextLengthError):
        run(engine, prompt=[])
    # exactly filling the context is fine
    _, _, ids, _ = run(engine, prompt=PROMPT[:4], max_new_tokens=target.max_length - 4)
    assert len(ids) == target.max_length - 4


# ------------------------------------------------------------------------------------ stop strings

@pytest.mark.parametrize("method, draft", METHODS)
def test_stop_string_truncates_the_text(target, drafts, plain, method, draft):
    full = plain[0]
    stop = full[20:23]
    cut = full.find(stop)
    engine = make_engine(target, method, drafts[draft] if draft else None, k=4)
    text, pieces, ids, stats = run(engine, stop=(stop,))
    assert text == full[:cut]
    assert "".join(p.text for p in pieces) == full[:cut]
    # Generation stopped at the token that completed the stop string (one char per token here).
    assert ids == plain[1][:cut + len(stop)]
    if method != "none":
        assert_speculated(stats)


def test_earliest_of_several_stop_strings_wins(target, plain):
    full = plain[0]
    late, early = full[25:28], full[12:14]
    cut = min(full.find(late), full.find(early))
    text = run(make_engine(target), stop=(late, early))[0]
    assert text == full[:cut]


def test_stop_string_is_never_streamed(target, plain):
    """Text that may start a stop string is held back; what was streamed is never retracted."""
    full = plain[0]
    stop = full[20:24]
    cut = full.find(stop)
    engine = make_engine(target)
    emitted = ""
    for piece in engine.stream(PROMPT, GREEDY, GenerationConfig(max_new_tokens=40, stop=(stop,))):
        emitted += piece.text
        assert full[:cut].startswith(emitted)  # a prefix of the final text, never any of the stop string
        assert stop[:1] not in emitted[cut:]
    assert emitted == full[:cut]


def test_partial_stop_string_is_held_back_then_released(target, plain):
    full = plain[0]
    i = 20
    stop = full[i:i + 2] + "\x00"  # starts like the text at i but never completes (no token gives NUL)
    engine = make_engine(target)
    lengths = []
    emitted = ""
    pieces = list(engine.stream(PROMPT, GREEDY, GenerationConfig(max_new_tokens=40, stop=(stop,))))
    for piece in pieces:
        emitted += piece.text
        lengths.append(len(emitted))
        assert full.startswith(emitted)
    assert emitted == full  # nothing lost
    # After tokens i and i + 1 (one char each) the two chars that match the stop's start are held.
    assert lengths[i + 1] <= i
    assert lengths[-1] == len(full)


def test_partial_stop_string_at_the_end_is_flushed(target, plain):
    full = plain[0]
    n = 30
    stop = full[n - 2:n] + "\x00"  # the last two generated chars look like the stop's start
    engine = make_engine(target)
    pieces = list(engine.stream(PROMPT, GREEDY, GenerationConfig(max_new_tokens=n, stop=(stop,))))
    assert "".join(p.text for p in pieces) == full[:n]
    assert [p.token_id for p in pieces[:n]] == plain[1][:n]


def test_partial_stop_helper():
    assert _partial_stop("hello wor", ("world",)) == 3
    assert _partial_stop("hello", ("world",)) == 0
    assert _partial_stop("ab", ("b", "abc")) == 2
    assert _partial_stop("xa", ("ab", "aab")) == 1


# ------------------------------------------------------------------------------------ sampling

@pytest.mark.parametrize("method, draft", [("none", None), ("draft-model", "near"), ("prompt-lookup", None)])
def test_sampling_with_a_seed_is_reproducible(target, drafts, method, draft):
    engine = make_engine(target, method, drafts[draft] if draft else None, k=4)
    a = run(engine, sampling=SAMPLED)
    b = run(engine, sampling=SAMPLED)
    c = run(engine, sampling=SamplingConfig(temperature=1.0, seed=99))
    assert a[2] == b[2] and a[0] == b[0]
    assert a[2] != c[2]
    assert len(a[2]) == 40
    if method != "none":
        assert_speculated(a[3])


def test_sampling_with_transforms_and_draft_equal_to_target(target, drafts):
    cfg = SamplingConfig(temperature=0.8, top_k=10, top_p=0.9, seed=5)
    engine = make_engine(target, "draft-model", drafts["target"], k=4)
    a = run(engine, sampling=cfg)
    assert a[2] == run(engine, sampling=cfg)[2]
    assert_speculated(a[3])
    # The runtime is batch-invariant (a row's logits do not depend on the block it is computed
    # in), so the draft's q equals the target's p bitwise and min(1, p/q) = 1 for every token.
    assert a[3].acceptance_rate == 1.0


def test_greedy_ignores_the_seed(target, plain):
    assert run(make_engine(target), sampling=SamplingConfig(temperature=0.0, seed=3))[2] == plain[1]


# ------------------------------------------------------------------------------------ log-probabilities

@pytest.fixture(scope="module")
def w8a8(models):
    """The target in w8a8: its rows do not depend on their block (test_batch_invariance)."""
    return LlamaModel.from_dir(models["target"][1], dtype=torch.float32, max_length=256, weight_format="w8a8")


@pytest.fixture(scope="module")
def w8a8_drafts(models):
    return {name: LlamaModel.from_dir(models[name][1], dtype=torch.float32, max_length=256, weight_format="w8a8")
            for name in ("near", "other")}


def scored(pieces):
    return [(p.token_id, p.logprob, p.top_logprobs) for p in pieces]


def test_logprobs_are_the_targets_own(w8a8):
    """Each token's log-probability is its row's raw log-softmax (temperature, top-k and top-p
    change which token is drawn, not what is reported), its alternatives that row's largest,
    most likely first: checked against one forward over the whole text."""
    for sampling in (GREEDY, SamplingConfig(temperature=0.7, top_k=5, seed=3)):
        _, pieces, ids, _ = run(make_engine(w8a8), sampling=sampling, logprobs=4)
        w8a8.reset()
        rows = torch.log_softmax(w8a8.forward(torch.tensor(PROMPT + ids)).logits[len(PROMPT) - 1:-1], -1)  # [n, V]
        assert [p.logprob for p in pieces] == rows.gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()
        for p, row in zip(pieces, rows):
            top_ids = [i for i, _ in p.top_logprobs]
            assert [lp for _, lp in p.top_logprobs] == row[top_ids].tolist() == sorted(row.topk(4).values.tolist(),
                                                                                        reverse=True)
            if sampling.greedy:
                assert top_ids[0] == p.token_id and p.top_logprobs[0][1] == p.logprob


@pytest.mark.parametrize("method, draft, trees", [("draft-model", "near", False), ("prompt-lookup", None, False),
                                                  ("hybrid", "other", False), ("draft-model", "near", True)])
def test_speculative_logprobs_are_plain_decodings(w8a8, w8a8_drafts, method, draft, trees):
    """Checked in blocks of guesses, the committed tokens carry the numbers plain decoding gives
    them: a chain's rows bit for bit; a tree's rows up to rounding (torch's attention over a tree
    mask sums in another order; the native kernel's do not, see the real-model tier)."""
    _, want, ids, _ = run(make_engine(w8a8), logprobs=3)
    engine = make_engine(w8a8, method, w8a8_drafts[draft] if draft else None, k=4, trees=trees)
    _, got, got_ids, stats = run(engine, logprobs=3)
    assert got_ids == ids and stats.accepted_tokens > 0
    if not trees:
        assert scored(got) == scored(want)
    else:
        for g, w in zip(got, want, strict=True):
            assert g.token_id == w.token_id and g.logprob == pytest.approx(w.logprob, rel=1e-5, abs=1e-6)
            assert [i for i, _ in g.top_logprobs] == [i for i, _ in w.top_logprobs]


def test_no_logprobs_unless_asked(target):
    _, pieces, _, _ = run(make_engine(target), max_new_tokens=5)
    assert all(p.logprob is None and p.top_logprobs == () for p in pieces)
    _, pieces, _, _ = run(make_engine(target), max_new_tokens=5, logprobs=0)
    assert all(p.logprob is not None and p.logprob <= 0 and p.top_logprobs == () for p in pieces)
    for bad in (-1, 21, True, 2.0, "3"):
        with pytest.raises(ParameterError, match="logprobs"):
            GenerationConfig(logprobs=bad)


@pytest.mark.parametrize("block", [128, 5])
def test_prompt_scores_are_the_prompt_rows(w8a8, w8a8_drafts, block, monkeypatch):
    """GenerationConfig.prompt_logprobs: each prompt token after the first scored by the row before
    it, as one forward over the prompt gives it (prefilled SCORED_BLOCK rows at a time: the same
    bits); nothing generated with max_new_tokens 0, and the generation after a scored prefill is
    the one after a plain prefill."""
    from specdraft import engine as engine_module

    monkeypatch.setattr(engine_module, "SCORED_BLOCK", block)
    w8a8.reset()
    rows = torch.log_softmax(w8a8.forward(torch.tensor(PROMPT)).logits[:-1], -1)  # [n-1, V]
    e = make_engine(w8a8)
    _, pieces, ids, _ = run(e, max_new_tokens=0, prompt_logprobs=2)
    assert pieces == [] and ids == []
    assert [lp for lp, _ in e.prompt_scores] == rows.gather(1, torch.tensor(PROMPT[1:])[:, None])[:, 0].tolist()
    assert [[i for i, _ in top] for _, top in e.prompt_scores] == rows.topk(2).indices.tolist()
    _, _, want, _ = run(make_engine(w8a8, "draft-model", w8a8_drafts["near"], k=4))
    speculative = make_engine(w8a8, "draft-model", w8a8_drafts["near"], k=4)
    _, _, got, _ = run(speculative, prompt_logprobs=0)
    assert got == want and len(speculative.prompt_scores) == len(PROMPT) - 1
    with pytest.raises(ParameterError, match="max-new-tokens"):
        GenerationConfig(max_new_tokens=0)


# ------------------------------------------------------------------------------------ penalties

PENALIZED = SamplingConfig(frequency_penalty=1.5, presence_penalty=0.5, repetition_penalty=1.3)


def naive_penalized(model, prompt, n, cfg):
    """Greedy decoding with cfg's penalties, written out: the whole text's forward every step, then
    each logit by the formulas (repetition over the prompt and the output, then frequency and
    presence over the output)."""
    out = []
    for _ in range(n):
        model.reset()
        row = model.forward(torch.tensor(prompt + out)).logits[-1].clone()
        for t in set(prompt) | set(out):
            x = row[t]
            row[t] = x / cfg.repetition_penalty if x > 0 else x * cfg.repetition_penalty
        for t in set(out):
            row[t] -= cfg.frequency_penalty * torch.tensor(float(out.count(t))) + cfg.presence_penalty
        out.append(int(row.argmax()))
    return out


def test_penalties_are_what_their_formulas_say(w8a8):
    _, _, ids, _ = run(make_engine(w8a8), sampling=PENALIZED, max_new_tokens=24)
    assert ids == naive_penalized(w8a8, PROMPT, 24, PENALIZED)
    _, _, unpenalized, _ = run(make_engine(w8a8), max_new_tokens=24)
    assert ids != unpenalized  # they bite: the test could fail
    for bad in ({"frequency_penalty": 2.5}, {"presence_penalty": -3}, {"repetition_penalty": 0},
                {"repetition_penalty": 11}, {"frequency_penalty": float("nan")}, {"presence_penalty": True}):
        with pytest.raises(ParameterError, match="penalty"):
            SamplingConfig(**bad)


@pytest.mark.parametrize("method, draft, trees", [("draft-model", "near", False), ("draft-model", "near", True),
                                                  ("prompt-lookup", None, False), ("hybrid", "near", True)])
def test_penalized_speculation_equals_penalized_plain(w8a8, w8a8_drafts, method, draft, trees):
    """Each row of a check is penalised by the text before it, guesses on its branch included, so
    the verifier judges guesses against what plain decoding would choose from."""
    _, _, want, _ = run(make_engine(w8a8), sampling=PENALIZED)
    engine = make_engine(w8a8, method, w8a8_drafts[draft] if draft else None, k=4, trees=trees)
    _, _, got, stats = run(engine, sampling=PENALIZED)
    assert got == want and stats.draft_tokens > 0
    if draft:  # (the penalties reject what prompt lookup copies, as they are meant to)
        assert stats.accepted_tokens > 0


@pytest.mark.parametrize("method, draft, trees", [("draft-model", "near", True), ("prompt-lookup", None, False)])
def test_logit_bias_bans_and_forces_tokens_exactly(w8a8, w8a8_drafts, method, draft, trees):
    """OpenAI's logit_bias on the target's rows: -100 bans a token plain decoding chose, +100 forces
    one; speculation gives plain decoding's biased tokens."""
    _, _, unbiased, _ = run(make_engine(w8a8), max_new_tokens=24)
    banned = SamplingConfig(logit_bias={unbiased[0]: -100.0, unbiased[3]: -100.0})
    _, _, want, _ = run(make_engine(w8a8), sampling=banned, max_new_tokens=24)
    assert unbiased[0] not in want and unbiased[3] not in want
    engine = make_engine(w8a8, method, w8a8_drafts[draft] if draft else None, k=4, trees=trees)
    _, _, got, stats = run(engine, sampling=banned, max_new_tokens=24)
    assert got == want and stats.draft_tokens > 0
    forced = SamplingConfig(logit_bias={7: 100})
    assert run(make_engine(w8a8), sampling=forced, max_new_tokens=5)[2] == [7] * 5
    assert forced.logit_bias == ((7, 100.0),)
    for bad in ({-1: 1.0}, {3: 101}, {3: float("nan")}, [(3, 1), (3, 2)], {"a": 1}):
        with pytest.raises(ParameterError, match="logit bias"):
            SamplingConfig(logit_bias=bad)
    with pytest.raises(ParameterError, match="past the target's vocabulary"):
        run(make_engine(w8a8), sampling=SamplingConfig(logit_bias={10**6: 1.0}), max_new_tokens=2)


def test_a_rows_penalties_are_those_of_its_text_committed():
    """Row r penalised by (generated, branch r) has the bits of a row penalised with the branch
    committed already: the identity that keeps penalised speculation exact."""
    from specdraft.sampling import apply_penalties

    g = torch.Generator().manual_seed(5)
    logits = 4 * torch.randn(6, 50, generator=g)
    generated = torch.randint(0, 50, (30,), generator=g).tolist()
    branches = [[], [7], [7, 7], [3], [3, 9], [generated[0], 41]]
    prompt = torch.unique(torch.randint(0, 50, (12,), generator=g))
    rows = apply_penalties(logits, generated, branches, prompt, PENALIZED)
    for r, branch in enumerate(branches):
        alone = apply_penalties(logits[r:r + 1], generated + branch, [[]], prompt, PENALIZED)
        assert torch.equal(rows[r], alone[0])
    assert not torch.equal(rows[1], rows[0]) and apply_penalties(logits, generated, branches, prompt, GREEDY) is logits


# ------------------------------------------------------------------------------------ HF adapter

@pytest.fixture(scope="module")
def hf_target(models):
    return HFModel.from_dir(models["target"][1], dtype=torch.float32, max_length=256)


def test_hf_adapter_logits_equal_transformers(models, hf_target):
    hf, _ = models["target"]
    hf_target.reset()
    out = hf_target.forward(torch.tensor(PROMPT[:9]))
    out2 = hf_target.forward(torch.tensor(PROMPT[9:]))
    torch.testing.assert_close(torch.cat([out.logits, out2.logits]), hf_logits(hf, PROMPT), atol=1e-4, rtol=0)
    hf_target.rollback(5)
    out = hf_target.forward(torch.tensor([70, 71]), last_only=True)
    assert out.logits.shape == (1, VOCAB)
    torch.testing.assert_close(out.logits[0], hf_logits(hf, PROMPT[:5] + [70, 71])[-1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("method, draft", [("none", None), ("draft-model", "near"), ("prompt-lookup", None)])
def test_hf_adapter_target_gives_native_greedy_tokens(hf_target, drafts, plain, method, draft):
    engine = make_engine(hf_target, method, drafts[draft] if draft else None, k=4)
    text, _, ids, stats = run(engine)
    assert ids == plain[1]
    if method != "none":
        assert_speculated(stats)


# ------------------------------------------------------------------------------------ detokenizer

def test_detokenizer_never_splits_a_multibyte_character():
    detok = Detokenizer(ByteTokenizer())
    out = [detok.add(t) for t in "aé€b".encode()]
    assert out == ["a", "", "é", "", "", "€", "b"]



def test_a_sliding_window_in_force_bounds_the_context():
    """Within its window a sliding-window model attends as a full one; the runtime holds no more."""
    from transformers import MistralConfig, Qwen2Config

    from specdraft.models.llama import read_spec

    assert read_spec(MistralConfig(sliding_window=32, max_position_embeddings=256)).max_position == 32
    assert read_spec(MistralConfig(sliding_window=None, max_position_embeddings=256)).max_position == 256
    off = Qwen2Config(sliding_window=16, use_sliding_window=False, max_position_embeddings=256)
    on = Qwen2Config(sliding_window=16, use_sliding_window=True, max_window_layers=0, max_position_embeddings=256)
    assert read_spec(off).max_position == 256 and read_spec(on).max_position == 16


def test_a_llama_the_runtime_cannot_compute_goes_to_transformers(tmp_path):
    """MLP biases (or another activation than silu): the native runtime would drop them, so auto
    picks the transformers adapter and --runtime native says why in one line."""
    from specdraft.errors import ModelFileError
    from specdraft.models.llama import LlamaModel, not_native

    model = build_hf("llama", seed=4)
    model.config.mlp_bias = True
    assert "biases" in not_native(model.config)
    model.config.mlp_bias, model.config.hidden_act = False, "gelu"
    assert "activation" in not_native(model.config)
    model.config.hidden_act = "silu"
    assert not_native(model.config) is None
    d = save(model, tmp_path / "m")
    cfg = (d / "config.json").read_text().replace('"mlp_bias": false', '"mlp_bias": true')
    (d / "config.json").write_text(cfg)
    with pytest.raises(ModelFileError, match=r"biases.*; use --runtime hf"):
        LlamaModel.from_dir(d, dtype=torch.float32)
