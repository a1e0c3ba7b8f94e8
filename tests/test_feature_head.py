"""The trained-head prophet (heads/ and drafters/feature_head) on a tiny random target.

A head is recorded and trained in-process on the tiny target's own text; then `head` and
`hybrid-head` must reproduce plain greedy decoding token for token, sample with a seed
reproducibly, and actually draft (and get guesses accepted).
"""
from __future__ import annotations

import json

import pytest
import torch

from _tiny import VOCAB, build_hf, drafted, drafting_engine, load_native, own_texts, save
from specdraft.config import GenerationConfig, SamplingConfig
from specdraft.drafters import Draft, needs_head
from specdraft.drafters.feature_head import output_weight
from specdraft.errors import ModelFileError
from specdraft.heads.data import FeatureSet, record
from specdraft.heads.model import FeatureHead
from specdraft.heads.train import TrainConfig, noisy, sampled_softmax, train_head

PROMPTS = [[5, 17, 33, 2, 5, 17, 33, 8], [41, 5, 17, 60, 3], [9, 9, 1, 70, 12, 30]]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_native(save(build_hf("qwen2", seed=0), tmp_path_factory.mktemp("head") / "target"))


def engine(target, method, head=None, **spec_kw):
    return drafting_engine(target, method, head, ngram_min=1, **spec_kw)


def generate(target, method, prompt, head=None, sampling=SamplingConfig(), n=40):
    return drafted(target, method, prompt, head, sampling, n, ngram_min=1)


@pytest.fixture(scope="module")
def trained(target):
    """Features recorded on the target's own greedy text for 24 random prompts; a head on them."""
    seqs = own_texts(target)
    data = record(target, seqs)
    cfg = TrainConfig(inner=128, vocab=VOCAB, epochs=30, batch=64, negatives=32, lr=3e-3, holdout=0.2)
    head, report = train_head(data, target.embed, output_weight(target, VOCAB), cfg, log=lambda *a: None)
    return data, head, report


def test_recorded_features_are_the_targets(target, trained):
    data, _, _ = trained
    assert len(data) == int(data.starts[-1]) == data.features.shape[0] == data.top.shape[0]
    a, b = int(data.starts[0]), int(data.starts[1])
    target.reset()
    out = target.forward(data.tokens[a:b], need_hidden=True)
    assert torch.equal(data.top[a:b, 0], out.logits.argmax(-1))
    assert torch.allclose(data.features[a:b].float(), out.hidden, atol=2e-3, rtol=1e-2)


def test_training_beats_the_untrained_head(target, trained):
    data, head, report = trained
    assert report["steps"] > 0 and len(report["val_agreement"]) == 3
    untrained = FeatureHead(head.cfg).eval()
    w = output_weight(target, VOCAB)
    rows = torch.arange(int(data.starts[-2]), int(data.starts[-1]) - 1)  # one document, one step

    def agreement(h):
        with torch.no_grad():
            f = h(data.features[rows].float(), target.embed[data.tokens[rows + 1]].float())
            return float(((f @ w.T).argmax(-1) == data.top[rows + 1, 0]).float().mean())

    assert agreement(head) > agreement(untrained) + 0.2, (agreement(head), agreement(untrained))


def test_feature_noise_is_a_share_of_each_rows_rms_and_trains(target, trained):
    torch.manual_seed(0)
    x = torch.randn(4000, 64) * torch.tensor([1.0, 10.0, 0.1, 3.0]).repeat(1000)[:, None]
    assert noisy(x, 0.0) is x
    ratio = (noisy(x, 0.2) - x).pow(2).mean(-1).sqrt() / x.pow(2).mean(-1).sqrt()  # [rows]
    for r in ratio.view(1000, 4).T:  # each scale of row alike
        assert abs(float(r.mean()) - 0.2) < 0.01
    data, head, _ = trained
    cfg = TrainConfig(inner=128, vocab=VOCAB, epochs=2, batch=64, negatives=32, lr=3e-3, holdout=0.2,
                      feature_noise=0.1, soft_labels=0.5)
    noisy_head, report = train_head(data, target.embed, output_weight(target, VOCAB), cfg, log=lambda *a: None,
                                    init=head)
    assert report["steps"] > 0 and all(a > 0 for a in report["val_agreement"])


def test_soft_labels_are_the_targets_distribution_over_the_sampled_ids():
    torch.manual_seed(0)
    N, H, V, K = 5, 8, 40, 4
    w = torch.randn(V, H)
    f, true_f = torch.randn(N, H, requires_grad=True), torch.randn(N, H)
    cand = torch.stack([torch.randperm(V)[:K] for _ in range(N)])
    cand[1, 3] = -1  # a candidate outside the vocabulary
    neg = torch.tensor([cand[0, 0].item(), 7, 11])  # the first row's label among the negatives
    hard = sampled_softmax(f, cand, w, neg)
    assert torch.equal(hard, sampled_softmax(f, cand, w, neg, true_f, 0.0))
    ids = torch.cat([cand.clamp_min(0), neg.expand(N, -1)], -1)  # [N, K + 3]
    drop = torch.cat([cand < 0, neg[None, :] == cand[:, :1]], -1)
    z, zt = (torch.einsum("nh,nkh->nk", x, w[ids]).masked_fill(drop, float("-inf")) for x in (f, true_f))
    assert torch.allclose(hard, torch.nn.functional.cross_entropy(z, torch.zeros(N, dtype=torch.long)))
    want = -(zt.softmax(-1) * z.log_softmax(-1).masked_fill(drop, 0)).sum(-1).mean()
    soft = sampled_softmax(f, cand, w, neg, true_f, 1.0)
    assert torch.allclose(soft, want)
    assert torch.allclose(sampled_softmax(f, cand, w, neg, true_f, 0.25), 0.75 * hard + 0.25 * want)
    soft.backward()
    assert torch.isfinite(f.grad).all() and f.grad.abs().sum() > 0


@pytest.mark.parametrize("trees", [False, True])
@pytest.mark.parametrize("method", ["head", "hybrid-head"])
def test_greedy_equals_plain_and_guesses_are_accepted(target, trained, method, trees):
    _, head, _ = trained
    assert needs_head(method)
    accepted = 0
    for prompt in PROMPTS:
        plain, _ = generate(target, "none", prompt)
        e = engine(target, method, head, trees=trees)
        e.generate(prompt, SamplingConfig(), GenerationConfig(max_new_tokens=40))
        ids, stats = list(e.token_ids), e.stats
        assert ids == plain
        assert stats.drafts > 0 and stats.draft_tokens > 0
        accepted += stats.accepted_tokens
    assert accepted > 0  # the trained head does predict the target


def test_the_head_alone_extends_its_trees_and_hybrid_head_extends_once(target, trained):
    """Drafting alone with trees, the head's likeliest nodes are extended by lookup after them
    (drafters.extend), unless --no-extend; inside hybrid-head the composite extends, not the head.
    learn hands the extension's nodes to the extension and the head's own to its rates."""
    _, head, _ = trained
    alone = engine(target, "head", head, trees=True).drafter
    assert alone.extension is not None
    assert engine(target, "head", head, trees=True, extend=False).drafter.extension is None
    assert engine(target, "head", head, trees=False).drafter.extension is None
    hybrid = engine(target, "hybrid-head", head, trees=True).drafter
    assert hybrid.extension is not None and hybrid.model.extension is None
    alone.feature = torch.zeros(target.spec.hidden_size)  # ready; its tree: one guess, 3
    alone._propose_tree = lambda context, k, costed, draft_cost: Draft([3], parents=[-1], chances=[0.9])
    d = alone.propose([1, 2, 3, 4, 5, 6, 1, 2], 4, SamplingConfig(), torch.Generator())
    assert d.tokens == [3, 4, 5, 6] and d.parents == [-1, 0, 1, 2]  # ... 1 2 | 3 -> what followed 2 3
    alone.proposed = [0.9]
    own_before = sum(alone.rates.tried)
    copy_before = sum(sum(r.tried) for r in alone.extension.rates.values())
    alone.learn([(0, True), (1, True), (2, False)])
    assert sum(alone.rates.tried) == own_before + 1
    assert sum(sum(r.tried) for r in alone.extension.rates.values()) == copy_before + 2


def test_greedy_head_drafts_are_branched_trees_and_chains_without(target, trained):
    _, head, _ = trained
    drafts = {}
    for trees in (True, False):
        e = engine(target, "head", head, trees=trees, k=4)
        e.drafter.take_features(target.forward(torch.tensor(PROMPTS[0]), need_hidden=True).hidden)
        drafts[trees] = e.drafter.propose(PROMPTS[0], 4, SamplingConfig(), torch.Generator())
        target.reset()
    tree, chain = drafts[True], drafts[False]
    assert tree.parents is not None and len(set(tree.parents)) < len(tree.parents)  # a node with 2+ children
    assert all(p < j for j, p in enumerate(tree.parents)) and len(tree) > 4  # parents first
    assert all(tree.chances[j] <= tree.chances[p] for j, p in enumerate(tree.parents) if p >= 0)
    sent = e.policy.cut(tree, 4)  # costs not measured: the k likeliest nodes
    assert len(sent.draft) == 4 and all(p < j for j, p in enumerate(sent.draft.parents or []))
    assert sorted(sent.nodes, key=lambda j: -tree.chances[j]) == sorted(range(len(tree)), key=lambda j: -tree.chances[j])[:4]
    assert chain.parents is None and len(chain) == 4


def test_under_an_output_format_the_heads_children_are_what_it_allows(target, trained):
    """With an output format (Drafter.use_format) every child of the head's tree is among what the
    format allows after its branch: here the ids of the same parity as the branch's length."""
    _, head, _ = trained
    e = engine(target, "head", head, trees=True, k=4)
    asked = []

    def allowed(branch: list[int]) -> torch.Tensor:
        asked.append(list(branch))
        return torch.arange(VOCAB) % 2 == len(branch) % 2

    e.drafter.use_format(allowed)
    e.drafter.take_features(target.forward(torch.tensor(PROMPTS[0]), need_hidden=True).hidden)
    tree = e.drafter.propose(PROMPTS[0], 4, SamplingConfig(), torch.Generator())
    target.reset()
    depth = [0] * len(tree)
    for j, p in enumerate(tree.parents):
        depth[j] = 1 if p < 0 else depth[p] + 1
    assert len(tree) > 4 and all(t % 2 == (d - 1) % 2 for t, d in zip(tree.tokens, depth))
    assert [] in asked and any(len(b) >= 2 for b in asked)
    e.drafter.use_format(None)


@pytest.mark.parametrize("method", ["head", "hybrid-head"])
def test_a_bf16_target_drafts_with_the_head(tmp_path, trained, method):
    # the head runs in float32 whatever the target's dtype: its features meet a bf16 target's
    # output rows in that dtype (a bf16 target once crashed here with a dtype mismatch)
    _, head, _ = trained
    bf16 = load_native(save(build_hf("qwen2", seed=0), tmp_path / "target"), dtype=torch.bfloat16)
    for prompt in PROMPTS:
        ids, stats = generate(bf16, method, prompt, head, n=20)
        assert len(ids) == 20 and stats.drafts > 0 and stats.draft_tokens > 0


@pytest.mark.parametrize("trees", [False, True])
def test_sampling_is_reproducible_and_drafts(target, trained, trees):
    _, head, _ = trained
    s = SamplingConfig(temperature=0.8, top_k=20, seed=7)
    a, stats = drafted(target, "head", PROMPTS[0], head, s, ngram_min=1, trees=trees)
    b, _ = drafted(target, "head", PROMPTS[0], head, s, ngram_min=1, trees=trees)
    assert a == b and stats.draft_tokens > 0 and len(a) == 40


def test_sampled_head_trees_are_deterministic_branched_trees(target, trained):
    """Sampling, the head drafts the same trees as greedy: its likeliest children, one-hot for
    the verifier (no q), whose recursive rejection over a node's children keeps the target's
    distribution (tests/test_tree_verify.py); a chain's guesses are drawn from the head's q or
    are its argmax guesses, one-hot (``sample_from_q``)."""
    _, head, _ = trained
    s = SamplingConfig(temperature=0.8, top_k=20, seed=7)
    drafts = {}
    for trees, sampling, from_q in ((True, s, None), (True, SamplingConfig(), None), (False, s, True),
                                    (False, s, False), (False, SamplingConfig(), None)):
        e = engine(target, "head", head, trees=trees, k=4)
        e.drafter.sample_from_q = from_q
        target.reset()
        e.drafter.take_features(target.forward(torch.tensor(PROMPTS[0]), need_hidden=True).hidden)
        drafts[trees, sampling.greedy, from_q] = e.drafter.propose(PROMPTS[0], 4, sampling, torch.Generator().manual_seed(0))
        target.reset()
    sampled, greedy = drafts[True, False, None], drafts[True, True, None]
    assert sampled.probs is None and sampled.tokens == greedy.tokens and sampled.parents == greedy.parents
    assert len(set(sampled.parents)) < len(sampled.parents)  # a node with 2+ children
    drawn, best, greedy_chain = drafts[False, False, True], drafts[False, False, False], drafts[False, True, None]
    assert drawn.parents is None and drawn.probs is not None and drawn.probs.shape[0] == len(drawn)
    assert best.probs is None and best.tokens == greedy_chain.tokens  # the argmax guesses, one-hot


def test_save_load_round_trip_and_bad_files(tmp_path, trained):
    _, head, _ = trained
    head.save(tmp_path / "h")
    back = FeatureHead.load(tmp_path / "h")
    assert back.cfg == head.cfg
    f, e = torch.randn(2, head.cfg.hidden_size), torch.randn(2, head.cfg.hidden_size)
    assert torch.allclose(back(f, e), head(f, e), atol=5e-2)  # stored in bf16
    with pytest.raises(ModelFileError, match="no drafting head"):
        FeatureHead.load(tmp_path / "missing")
    (tmp_path / "h" / "head.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelFileError, match="cannot load the drafting head"):
        FeatureHead.load(tmp_path / "h")
    cfg = json.loads((tmp_path / "h" / "head.json").read_text())
    assert cfg["vocab"] == VOCAB


def test_a_loaded_head_holds_the_files_weights_and_leaves_torch_init_as_it_was(tmp_path, trained):
    """read_drafter builds the module without torch.nn.init's random fills (its weights are loaded
    strictly right after): every parameter is the file's, a file that lacks one is refused, and
    torch.nn.init is whole again afterwards, after a refused file too."""
    from safetensors.torch import load_file, save_file

    _, head, _ = trained
    init = torch.nn.init.kaiming_uniform_
    head.save(tmp_path / "h")
    back, stored = FeatureHead.load(tmp_path / "h"), load_file(str(tmp_path / "h" / "head.safetensors"))
    assert set(dict(back.named_parameters())) <= set(stored)
    assert all(torch.equal(v, stored[k].float() if v.is_floating_point() else stored[k])
               for k, v in back.state_dict().items())
    assert torch.nn.init.kaiming_uniform_ is init
    name = next(iter(dict(head.named_parameters())))
    save_file({k: v for k, v in stored.items() if k != name}, str(tmp_path / "h" / "head.safetensors"))
    with pytest.raises(ModelFileError, match="cannot load the drafting head"):
        FeatureHead.load(tmp_path / "h")
    assert torch.nn.init.kaiming_uniform_ is init


def test_featureset_round_trip(tmp_path, trained):
    data, _, _ = trained
    data.save(tmp_path / "f.pt")
    back = FeatureSet.load(tmp_path / "f.pt")
    assert torch.equal(back.tokens, data.tokens) and torch.equal(back.features, data.features)


def test_recorded_answers_are_plain_greedy_decoding(target):
    from specdraft.heads.data import record_answers

    prompt = PROMPTS[1]
    plain, _ = generate(target, "none", prompt, n=20)
    data = record_answers(target, [prompt, PROMPTS[2]], max_new_tokens=20)
    assert len(data.starts) == 3
    a, b = int(data.starts[0]), int(data.starts[1])
    assert data.tokens[a:b].tolist() == [prompt[-1]] + plain  # last prompt token, then the answer
    assert data.top[a:b - 1, 0].tolist() == plain  # each row's choice is the next token
    target.reset()
    out = target.forward(torch.tensor(prompt + plain), need_hidden=True)
    assert torch.allclose(data.features[a:b].float(), out.hidden[len(prompt) - 1:], atol=2e-3, rtol=1e-2)


def test_concat_and_weighted_training_rows(trained):
    from specdraft.heads.data import concat
    from specdraft.heads.train import start_rows

    data, _, _ = trained
    both = concat([data, data])
    n_docs = len(data.starts) - 1
    assert len(both) == 2 * len(data) and len(both.starts) == 2 * n_docs + 1
    assert torch.equal(both.tokens[len(data):], data.tokens)
    docs = torch.tensor([0, n_docs])
    weight = torch.tensor([1] * n_docs + [3] * n_docs)
    rows = start_rows(both, docs, 3, weight)
    one = int(data.starts[1] - data.starts[0]) - 3
    assert len(rows) == 4 * one  # document 0 once, its copy three times


def test_chat_requests_are_varied_and_reproducible():
    from specdraft.heads.corpus import chat_requests

    a, b = chat_requests(27, seed=3), chat_requests(27, seed=3)
    assert a == b and len(a) == 27 and len(set(a)) > 20
    assert any("def" in r or "function" in r for r in a) and any("Translate" in r for r in a)


def test_cost_aware_head_stays_exact_and_cuts_drafts(target, trained):
    """With forward costs where a block costs a whole forward per token, no guess pays: the head
    sends nothing and the output is plain decoding's; with flat costs it sends its guesses."""
    from specdraft.costs import ForwardCosts, PassRates

    _, head, _ = trained
    prompt = [3, 1, 4, 1, 5]
    plain, _ = generate(target, "none", prompt)
    # (a one-token forward of 10 us where no guess pays: the head's step then costs many forwards, so
    # the payoff may skip it; a prophet whose drafting is nearly free is never skipped)
    for per_token, expect_drafts, one in ((1.0, False, 1e-5), (0.0, True, 0.05)):
        costs = ForwardCosts.fixed({t: 1 + per_token * (t - 1) for t in range(2, 12)}, one)  # kept while generating
        e = engine(target, "head", head, k=4, cost_rule=True)
        e.costs = e.policy.costs = costs
        e.generate(prompt, SamplingConfig(), GenerationConfig(max_new_tokens=40))
        assert list(e.token_ids) == plain
        if expect_drafts:
            assert e.stats.draft_tokens > 0, e.stats.summary()
        else:  # only the exploring guesses: one in EXPLORE of the drafts cut to nothing is sent
            assert e.stats.draft_tokens <= e.stats.target_forwards // ForwardCosts.EXPLORE, e.stats.summary()
        # the head's confidence bins counted exactly the guesses that passed
        rates, prior = e.drafter.rates, PassRates()
        assert sum(rates.passed) - sum(prior.passed) == pytest.approx(e.stats.accepted_tokens)
        assert sum(rates.tried) - sum(prior.tried) <= e.stats.draft_tokens
        if not expect_drafts:  # a head that never pays is skipped after its warm-up, explored now and then
            payoff = e.policy.payoff(e.drafter)
            assert payoff.skipped > 0 and payoff.steps < e.stats.target_forwards


def test_quantized_head_step_follows_the_fp32_head(trained):
    """The drafter runs the head's matrices quantized: its predicted features stay within a few
    per cent of the fp32 head's update (guesses only; the target still checks every one). Q6_K
    weights (a step of |max| / 31 per 16 weights) with 8-bit activations measured 1.9-3.1% here;
    W8A8 two-pass under 2%."""
    from specdraft.drafters.feature_head import QuantizedStep

    _, head, _ = trained
    torch.manual_seed(0)
    H = head.cfg.hidden_size
    f, e = torch.randn(5, H) * 3, torch.randn(5, H)
    with torch.inference_mode():
        want, got = head(f, e), QuantizedStep(head)(f, e)
    assert got.shape == want.shape
    assert ((got - want).norm(dim=-1) <= 0.05 * (want - f).norm(dim=-1)).all()  # the head's update, not f
