"""EAGLE (heads/eagle, heads/eagle_train, drafters/eagle) on a tiny random target.

A layer is trained in-process on the tiny target's own greedy text. The drafter must see what
training showed the layer (its incremental cache and tree masks give the unrolled training
outputs), reproduce plain greedy decoding token for token with chains and trees while its
guesses are accepted, and sample reproducibly with a seed.
"""
from __future__ import annotations

import json

import pytest
import torch

from _tiny import (
    VOCAB,
    build_hf,
    drafted,
    drafting_engine,
    eagle_chain,
    eagle_round_trip_decodes,
    greedy_runs_equal_plain,
    load_native,
    own_texts,
    save,
    tapped_unroll_and_chain,
)
from specdraft.config import SamplingConfig
from specdraft.drafters import head_kind
from specdraft.drafters.feature_head import output_weight
from specdraft.errors import ModelFileError, ParameterError
from specdraft.heads.data import FeatureSet, record
from specdraft.heads.eagle import EagleConfig, EagleHead
from specdraft.heads.eagle_train import (
    EagleTrainConfig,
    TargetShape,
    _gather,
    start_as_identity,
    stretches,
    train_eagle,
    unrolled,
)
from specdraft.heads.model import FeatureHead, HeadConfig, load_head
from specdraft.heads.vocab import as_draft_indices

PROMPTS = [[5, 17, 33, 2, 5, 17, 33, 8], [41, 5, 17, 60, 3], [9, 9, 1, 70, 12, 30]]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_native(save(build_hf("qwen2", seed=0), tmp_path_factory.mktemp("eagle") / "target"))


def engine(target, method, head=None, **spec_kw):
    return drafting_engine(target, method, head, **spec_kw)


generate = drafted


@pytest.fixture(scope="module")
def trained(target):
    """Features of the target's own greedy text for 24 random prompts; an EAGLE layer on them."""
    seqs = own_texts(target)
    data = record(target, seqs)
    # the tiny target's features are far from a real model's: there a random start learns faster
    cfg = EagleTrainConfig(inner=128, vocab=VOCAB, epochs=20, rows=256, chunk=64, negatives=32, lr=3e-3, holdout=0.2,
                           start="random")
    head, report = train_eagle(data, target.embed, output_weight(target, VOCAB), TargetShape.of(target.spec), cfg,
                               log=lambda *a: None)
    return data, head, report


def test_training_beats_the_untrained_layer(target, trained):
    data, head, report = trained
    assert report["steps"] > 0 and len(report["val_agreement"]) == 3
    from specdraft.heads.eagle_train import agreement

    items = stretches(data, torch.arange(len(data.starts) - 1), 64)
    w = output_weight(target, VOCAB)
    untrained = EagleHead(head.cfg).eval()
    got = agreement(head, data, items, target.embed, w, 3)
    base = agreement(untrained, data, items, target.embed, w, 3)
    assert got[0] > base[0] + 0.2 and got[2] > base[2] + 0.1, (got, base)


def test_the_identity_start_predicts_the_feature_it_reads():
    """start_as_identity: before training, h = rms(fc([f ; e])) * g_out is f up to its RMS's spread
    (attention and MLP start at zero): the MLP head's "the next feature is this one" start."""
    g = torch.Generator().manual_seed(0)
    H = 64
    head = EagleHead(EagleConfig(hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=16, inner=32, vocab=VOCAB))
    gain = 0.5 + torch.rand(H, generator=g)  # normed features times a gain, as the target's final norm gives
    raw = torch.randn(300, H, generator=g)
    f = raw * torch.rsqrt(raw.pow(2).mean(-1, keepdim=True)) * gain
    start_as_identity(head, f)
    x = head.inputs(f, torch.randn(300, H, generator=g))
    h = head.finish(x, torch.zeros(300, 4, 16))
    cos = torch.nn.functional.cosine_similarity(h, f, dim=-1)
    assert cos.min() > 0.98, cos.min()
    ratio = (h.norm(dim=-1) / f.norm(dim=-1)).sub(1).abs()  # the RMS of f varies by row (H = 64: by ~10%)
    assert ratio.mean() < 0.05 and ratio.max() < 0.25
    untrained = EagleHead(head.cfg)  # the random start does not
    assert torch.nn.functional.cosine_similarity(untrained.finish(untrained.inputs(f, f), torch.zeros(300, 4, 16)),
                                                 f, dim=-1).mean() < 0.5


def test_the_drafter_sees_what_training_showed(target, trained):
    """Chain steps drafted from committed position p through the drafter's cache and tree masks
    give the training unroll's h_j at start p (fp32 weights on both sides)."""
    data, head, _ = trained
    a, b = int(data.starts[0]), int(data.starts[1])
    n = 10  # committed rows 0..n-1 -> pairs 0..n-1 cached, the last is the root (start p = n-1)
    feats, tokens, _, pos, lengths, _, _ = _gather(data, [(a, b - a, 0)], data.top)
    want = [h[0, n - 1] for h, _ in unrolled(head, feats, tokens, pos, lengths, target.embed, 3)]

    drafter = engine(target, "eagle", head).drafter
    drafter.step = {name: getattr(head, name) for name in ("fc", "qkv", "o", "gate_up", "down")}
    got = eagle_chain(drafter, data.features[a:a + n].float(), data.tokens[a:a + n + 3].tolist(), n)
    for j in range(3):
        torch.testing.assert_close(got[j], want[j], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("trees", [False, True])
def test_greedy_equals_plain_and_guesses_are_accepted(target, trained, trees):
    _, head, _ = trained
    assert head_kind("eagle") == "eagle"
    runs = greedy_runs_equal_plain(target, "eagle", head, PROMPTS, trees=trees)
    assert sum(s.accepted_tokens for s in runs) > 0  # the trained layer does predict the target


def test_seeded_sampling_is_reproducible_and_drafts(target, trained):
    _, head, _ = trained
    sampling = SamplingConfig(temperature=0.8, seed=3)
    first, stats = generate(target, "eagle", PROMPTS[0], head, sampling)
    again, _ = generate(target, "eagle", PROMPTS[0], head, sampling)
    assert first == again and stats.drafts > 0 and stats.accepted_tokens > 0


def test_files_round_trip_and_kinds_are_checked(trained, tmp_path):
    _, head, _ = trained
    head.save(tmp_path / "eagle")
    assert json.loads((tmp_path / "eagle" / "head.json").read_text())["kind"] == "eagle"
    back = load_head(tmp_path / "eagle", "eagle")
    for name, value in head.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], value.to(torch.bfloat16).float())
    FeatureHead(HeadConfig(hidden_size=64, inner=8, vocab=VOCAB)).save(tmp_path / "mlp")
    with pytest.raises(ModelFileError, match="holds a 'mlp' drafter"):
        load_head(tmp_path / "mlp", "eagle")
    with pytest.raises(ModelFileError, match="holds a 'eagle' drafter"):
        load_head(tmp_path / "eagle", "mlp")
    (tmp_path / "eagle" / "head.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(ModelFileError, match="cannot load the EAGLE drafter"):
        load_head(tmp_path / "eagle", "eagle")


def random_features(n: int = 600, hidden: int = 32):
    """(data, emb, w): three documents of random features whose target choice is a function of the
    row's token, a random embedding and output rows (no model needed)."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (n,), generator=g)
    top = torch.stack([(tokens * 7 + 3) % VOCAB, *torch.randint(0, VOCAB, (15, n), generator=g)], 1)
    data = FeatureSet(torch.randn(n, hidden, generator=g).half(), tokens, top, torch.tensor([0, n // 3, 2 * n // 3, n]))
    return data, torch.randn(VOCAB, hidden, generator=g), torch.randn(VOCAB, hidden, generator=g)


def test_training_stops_on_time_with_a_checkpoint_and_resumes_from_it(tmp_path):
    data, emb, w = random_features()
    cfg = EagleTrainConfig(inner=32, vocab=VOCAB, epochs=3, rows=128, chunk=64, negatives=16, holdout=0.3)
    shape, ck, logs = TargetShape(4, 2, 8), tmp_path / "checkpoint.pt", []
    _, first = train_eagle(data, emb, w, shape, cfg, seconds=0.0, checkpoint=ck, log=logs.append)
    assert first["steps"] == 1 and not first["finished"] and ck.is_file()
    _, rest = train_eagle(data, emb, w, shape, cfg, checkpoint=ck, log=logs.append)
    assert rest["finished"] and rest["steps"] > 1 and any(line.startswith("resumed from") for line in logs)
    with pytest.raises(ParameterError, match="other settings"):
        train_eagle(data, emb, w, shape, EagleTrainConfig(**{**cfg.__dict__, "lr": 1e-3}), checkpoint=ck, log=logs.append)


# ---------------------------------------------------------------------- the "head" form
TAPS = (0, 1)  # of the 4-layer tiny target


@pytest.fixture(scope="module")
def tapped(tmp_path_factory):
    """A 4-layer tiny target, features of its own greedy text with taps, an MLP head with taps
    and a listed vocabulary trained on them, and a "head" form layer trained from that head."""
    from specdraft.heads.train import TrainConfig, train_head
    from specdraft.heads.vocab import choice_counts, frequent_ids

    model = load_native(save(build_hf("qwen2", seed=3, layers=4), tmp_path_factory.mktemp("eagle-head") / "target"))
    data = record(model, own_texts(model), taps=TAPS)
    ids = frequent_ids(choice_counts(data.top, VOCAB), VOCAB // 2)
    w = output_weight(model, ids)
    mlp, _ = train_head(data, model.embed, w, TrainConfig(inner=64, vocab=len(ids), epochs=6, batch=64, negatives=16,
                                                          lr=3e-3, holdout=0.2, taps=TAPS),
                        log=lambda *a: None, vocab_ids=ids)
    cfg = EagleTrainConfig(form="head", taps=TAPS, inner=64, vocab=len(ids), epochs=30, rows=256, chunk=64,
                           negatives=16, lr=3e-3, holdout=0.2)
    head, report = train_eagle(data, model.embed, w, TargetShape.of(model.spec), cfg, log=lambda *a: None,
                               vocab_ids=ids, start_head=mlp)
    return model, data, mlp, head, report, ids


def test_the_head_form_starts_as_the_mlp_head_it_is_built_on(tapped):
    """o at zero: step 0 over real rows (fused taps) and later steps on its own predictions give
    the MLP head's features, whatever the attention sees."""
    model, data, mlp, _, _, ids = tapped
    from specdraft.heads.eagle import EagleMLPHead

    layer = EagleMLPHead(EagleConfig(hidden_size=mlp.cfg.hidden_size, num_heads=4, num_kv_heads=2, head_dim=16,
                                     inner=mlp.cfg.inner, vocab=len(ids), form="head", taps=TAPS, listed_vocab=True))
    layer.start_from(mlp)
    assert torch.equal(layer.token_ids(), mlp.token_ids())
    feats, tokens, _, pos, lengths, aux, _ = _gather(data, [(0, int(data.starts[1]), 0)], data.top, taps=True)
    with torch.no_grad():
        got = [h for h, _ in unrolled(layer, feats, tokens, pos, lengths, model.embed, 3, aux)]
        f = mlp.entry(feats[0, :-1], aux[0, :-1])
        for j in range(3):
            nxt = (torch.arange(f.shape[0]) + j + 1).clamp_max(f.shape[0])
            f = mlp(f, model.embed[tokens[0, nxt]].float())
            torch.testing.assert_close(got[j][0], f, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="MLP head to start from"):
        EagleMLPHead(EagleConfig(hidden_size=mlp.cfg.hidden_size, num_heads=4, num_kv_heads=2, head_dim=16,
                                 inner=mlp.cfg.inner + 8, vocab=len(ids), form="head", taps=TAPS,
                                 listed_vocab=True)).start_from(mlp)


def test_the_head_form_learns_round_trips_and_decodes_exactly(tapped, tmp_path):
    model, data, mlp, head, report, ids = tapped
    from specdraft.heads.eagle import EagleMLPHead
    from specdraft.heads.eagle_train import agreement

    items = stretches(data, torch.arange(len(data.starts) - 1), 64)
    w = output_weight(model, ids)
    top = as_draft_indices(data.top.long(), len(ids), ids)
    from specdraft.heads.train import _agreement, start_rows

    got = agreement(head, data, items, model.embed, w, 3, top)[0]
    untrained = agreement(EagleMLPHead(head.cfg).eval(), data, items, model.embed, w, 3, top)[0]
    its_head = _agreement(mlp, data, model.embed, w, start_rows(data, torch.arange(len(data.starts) - 1), 3), 3, top)[0]
    assert got > untrained + 0.15 and got > its_head + 0.05, (got, untrained, its_head)
    eagle_round_trip_decodes(model, head, tmp_path / "eagle", EagleMLPHead, ids, PROMPTS)


def test_the_head_form_drafter_sees_what_training_showed(tapped):
    """The drafter's cache of fused real rows and its chain steps give the training unroll's h_j."""
    model, data, _, head, _, _ = tapped
    want, got = tapped_unroll_and_chain(model, data, head)
    for j in range(3):
        torch.testing.assert_close(got[j], want[j], atol=1e-4, rtol=1e-4)


def test_a_layer_form_refuses_taps_and_unknown_forms():
    with pytest.raises(ValueError, match="reads neither taps"):
        EagleConfig(hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4, inner=8, vocab=8, taps=(0,))
    with pytest.raises(ValueError, match="unknown EAGLE form"):
        EagleConfig(hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4, inner=8, vocab=8, form="tower")


def test_the_head_form_can_keep_the_heads_step_and_train_its_attention_alone():
    data, emb, w = random_features()
    H = data.features.shape[1]
    start = FeatureHead(HeadConfig(hidden_size=H, inner=32, vocab=VOCAB))
    cfg = EagleTrainConfig(inner=32, vocab=VOCAB, epochs=2, rows=128, chunk=64, negatives=16, holdout=0.3,
                           form="head", freeze_step=True)
    shape = TargetShape(4, 2, 8)
    layer, report = train_eagle(data, emb, w, shape, cfg, start_head=start, log=lambda *a: None)
    got = layer.state_dict()
    kept = start.state_dict()
    assert kept and all(torch.equal(got[k], v) for k, v in kept.items()), "the head's step moved"
    assert report["steps"] > 1 and layer.o.weight.abs().sum() > 0, "the attention did not train"
    moved, _ = train_eagle(data, emb, w, shape, EagleTrainConfig(**{**cfg.__dict__, "freeze_step": False}),
                           start_head=start, log=lambda *a: None)
    assert not torch.equal(moved.state_dict()["w1.weight"], kept["w1.weight"])  # the check above can fail
    with pytest.raises(ValueError, match="head form"):
        train_eagle(data, emb, w, shape, EagleTrainConfig(**{**cfg.__dict__, "form": "layer"}), log=lambda *a: None)


def test_request_rows_are_attended_to_but_never_scored():
    """A set with request rows (heads.data.with_requests): stretches start at most half a chunk of
    a request before its answer, drafting starts inside a request are not scored (their labels
    change nothing), and the scored starts attend to the request's features."""
    from specdraft.heads.eagle_train import _loss

    data, emb, w = random_features()
    data.request_rows = torch.tensor([50, 0, 120])
    items = stretches(data, torch.arange(3), 64)
    assert min(a for a, _, _ in items if a >= 400) == 400 + 120 - 32 and min(a for a, _, _ in items) == 50 - 32
    assert all(a + n - 1 > s + r for a, n, _ in items for s, r in [(0, 50), (200, 0), (400, 120)] if s <= a < s + 200)
    cfg = EagleTrainConfig(inner=32, vocab=VOCAB, negatives=16)
    head = EagleHead(EagleConfig(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, inner=32, vocab=VOCAB))
    torch.nn.init.normal_(head.o.weight, std=0.2)  # attention that reaches the output
    batch = [items[0]]  # rows 18..81 of document 0: starts 18..49 are its request
    neg = torch.arange(16)

    def loss(d):
        with torch.no_grad():
            return float(_loss(head, _gather(d, batch, d.top), emb, w, cfg, neg))

    base = loss(data)
    relabelled = FeatureSet(data.features, data.tokens, data.top.clone(), data.starts, request_rows=data.request_rows)
    relabelled.top[:51] = (relabelled.top[:51] + 1) % VOCAB  # targets of starts inside the request only
    assert loss(relabelled) == base
    moved = FeatureSet(data.features.clone(), data.tokens, data.top, data.starts, request_rows=data.request_rows)
    moved.features[18:50] += 1.0
    assert loss(moved) != base  # the scored starts see the request
    unmasked = FeatureSet(data.features, data.tokens, relabelled.top, data.starts)
    assert loss(unmasked) != loss(FeatureSet(data.features, data.tokens, data.top, data.starts))
