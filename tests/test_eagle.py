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

from _tiny import VOCAB, build_hf, drafted, drafting_engine, greedy_runs_equal_plain, load_native, own_texts, save
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
    got = agreement(head, data, items, target.embed, w, 3, VOCAB)
    base = agreement(untrained, data, items, target.embed, w, 3, VOCAB)
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
    feats, tokens, top, pos, lengths = _gather(data, [(a, b - a, 0)])
    want = [h[0, n - 1] for h, _ in unrolled(head, feats, tokens, pos, lengths, target.embed, 3)]

    drafter = engine(target, "eagle", head).drafter
    drafter.step = {name: getattr(head, name) for name in ("fc", "qkv", "o", "gate_up", "down")}
    context = data.tokens[a:a + n + 3].tolist()
    drafter.begin(context[:n - 4])
    drafter.take_features(data.features[a:a + n - 5].float())  # in two parts, as prefill then a verification
    drafter.context = context[:n - 3]
    drafter.advance([-1], [context[n - 4]], [], [])
    drafter.take_features(data.features[a + n - 5:a + n].float())
    drafter.context = context[:n + 1]
    got = [drafter.advance([-1], [context[n]], [], [])[0]]
    parents, feats_ = [], []
    for j in (1, 2):  # a chain: node j-1 holds the true token x_{n+j}, chosen from the previous output
        parents.append(j - 2)
        feats_.append(got[-1])
        got.append(drafter.advance([j - 1], [context[n + j]], parents, feats_)[0])
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


def test_training_stops_on_time_with_a_checkpoint_and_resumes_from_it(tmp_path):
    g = torch.Generator().manual_seed(0)
    N, H = 600, 32
    tokens = torch.randint(0, VOCAB, (N,), generator=g)
    top = torch.stack([(tokens * 7 + 3) % VOCAB, *torch.randint(0, VOCAB, (15, N), generator=g)], 1)
    data = FeatureSet(torch.randn(N, H, generator=g).half(), tokens, top, torch.tensor([0, 200, 400, 600]))
    emb, w = torch.randn(VOCAB, H, generator=g), torch.randn(VOCAB, H, generator=g)
    cfg = EagleTrainConfig(inner=32, vocab=VOCAB, epochs=3, rows=128, chunk=64, negatives=16, holdout=0.3)
    shape, ck, logs = TargetShape(4, 2, 8), tmp_path / "checkpoint.pt", []
    _, first = train_eagle(data, emb, w, shape, cfg, seconds=0.0, checkpoint=ck, log=logs.append)
    assert first["steps"] == 1 and not first["finished"] and ck.is_file()
    _, rest = train_eagle(data, emb, w, shape, cfg, checkpoint=ck, log=logs.append)
    assert rest["finished"] and rest["steps"] > 1 and any(line.startswith("resumed from") for line in logs)
    with pytest.raises(ParameterError, match="other settings"):
        train_eagle(data, emb, w, shape, EagleTrainConfig(**{**cfg.__dict__, "lr": 1e-3}), checkpoint=ck, log=logs.append)
