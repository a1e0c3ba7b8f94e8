"""EAGLE-3 style fused features: the target's layer outputs (``taps``) and a head that reads them.

A forward that taps layers must return their outputs without changing anything else, the same on
every path of the native runtime; recording keeps them aligned with the features; a head with
taps starts as the plain head, learns to use them, round-trips through its files, and decoding
with it stays the target's own greedy output.
"""
from __future__ import annotations

import pytest
import torch

from _tiny import VOCAB, build_hf, drafted, greedy_runs_equal_plain, own_texts, save
from specdraft.drafters.feature_head import output_weight
from specdraft.heads.data import FeatureSet, concat, record, record_answers
from specdraft.heads.model import FeatureHead, HeadConfig, load_head
from specdraft.heads.train import TrainConfig, train_head
from specdraft.models.llama import LlamaModel

TAPS = (0, 1)  # of a 4-layer target: a low and a middle layer
PROMPTS = [[5, 17, 33, 2, 5, 17, 33, 8], [41, 5, 17, 60, 3], [9, 9, 1, 70, 12, 30]]
IDS = torch.tensor([3, 14, 15, 92, 65, 35, 89, 79, 32, 38])


def _target(directory, weight_format: str) -> LlamaModel:
    if weight_format == "q4k":
        from specdraft.kernels import KernelUnavailable, gguf_ops

        try:
            gguf_ops()
        except KernelUnavailable as e:
            pytest.skip(str(e))
    d = save(build_hf("qwen2", seed=3, layers=4), directory)
    return LlamaModel.from_dir(d, dtype=torch.float32, max_length=256, weight_format=weight_format)


@pytest.fixture(scope="module", params=["dense", "q4k"])
def target(request, tmp_path_factory):
    return _target(tmp_path_factory.mktemp("taps") / "target", request.param)


def test_taps_are_the_layer_outputs_and_change_nothing_else(target):
    target.reset()
    plain = target.forward(IDS, need_hidden=True)
    assert plain.taps is None
    target.reset()
    tapped = target.forward(IDS, need_hidden=True, taps=TAPS)
    assert tapped.taps.shape == (len(IDS), len(TAPS), target.spec.hidden_size)
    assert torch.equal(tapped.hidden, plain.hidden) and torch.equal(tapped.logits, plain.logits)
    for j, layer in enumerate(TAPS):  # the tap, normed as the final norm does, is a shorter model's feature
        short = target.with_layers(list(range(layer + 1)))
        want = short.forward(IDS, need_hidden=True).hidden
        torch.testing.assert_close(target._rms(tapped.taps[:, j], target.norm), want, rtol=0, atol=0)
    target.reset()
    assert target.forward(IDS, taps=TAPS).taps is None  # taps come with the hidden states only


def test_every_native_path_taps_the_same(target):
    if target._decoder is None:
        pytest.skip("dense weights: one path")
    target.reset()
    fused = target.forward(IDS, need_hidden=True, taps=TAPS)
    target.fused = False
    try:
        target.reset()
        loop = target.forward(IDS, need_hidden=True, taps=TAPS)
    finally:
        target.fused = True
    assert torch.equal(fused.taps, loop.taps) and torch.equal(fused.hidden, loop.hidden)
    target.reset()
    one = target.forward(IDS[:6], need_hidden=True, taps=TAPS)  # a block, then row by row
    rows = [target.forward(IDS[i:i + 1], need_hidden=True, taps=TAPS).taps for i in range(6, len(IDS))]
    assert torch.equal(torch.cat([one.taps, *rows]), fused.taps)


@pytest.mark.parametrize("taps", [(1, 0), (0, 0), (3,), (-1,)])
def test_bad_taps_are_refused(target, taps):
    target.reset()
    with pytest.raises(ValueError, match="ascending"):
        target.forward(IDS, need_hidden=True, taps=taps)


def test_transformers_adapter_taps_the_same_layers(tmp_path):
    from specdraft.models.hf import HFModel

    d = save(build_hf("qwen2", seed=3, layers=4), tmp_path / "t")
    native = LlamaModel.from_dir(d, dtype=torch.float32, max_length=64)
    hf = HFModel.from_dir(d, dtype=torch.float32, max_length=64)
    want = native.forward(IDS, need_hidden=True, taps=TAPS).taps
    torch.testing.assert_close(hf.forward(IDS, need_hidden=True, taps=TAPS).taps, want, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def q4k(tmp_path_factory):
    return _target(tmp_path_factory.mktemp("taps-q4k") / "target", "q4k")


@pytest.fixture(scope="module")
def recorded(q4k):
    return record(q4k, own_texts(q4k, n=16, length=50), taps=TAPS)


def test_recording_keeps_taps_aligned_and_round_trips(q4k, recorded, tmp_path):
    data = recorded
    assert data.taps == TAPS and data.aux.shape == (len(data), len(TAPS), q4k.spec.hidden_size)
    a, b = int(data.starts[1]), int(data.starts[2])
    q4k.reset()
    out = q4k.forward(data.tokens[a:b], need_hidden=True, taps=TAPS)
    assert torch.equal(data.aux[a:b], out.taps.to(torch.float16))
    data.save(tmp_path / "f.pt")
    back = FeatureSet.load(tmp_path / "f.pt")
    assert back.taps == TAPS and torch.equal(back.aux, data.aux)
    assert concat([data, back]).aux.shape[0] == 2 * len(data)
    plain = FeatureSet(data.features, data.tokens, data.top, data.starts)
    assert concat([data, plain]).aux is None  # a set without taps drops them all
    # keep_last keeps a sequence's tail only (an answer after its request)
    tail = record(q4k, [data.tokens[a:b].tolist()], taps=TAPS, keep_last=[5])
    assert torch.equal(tail.aux, data.aux[b - 5:b]) and torch.equal(tail.tokens, data.tokens[b - 5:b])
    answers = record_answers(q4k, [PROMPTS[0]], max_new_tokens=8, taps=TAPS)
    assert answers.aux.shape == (len(answers), len(TAPS), q4k.spec.hidden_size)


def test_a_head_with_taps_starts_as_the_plain_head():
    cfg = HeadConfig(hidden_size=16, inner=8, vocab=10, taps=[2, 5])
    head = FeatureHead(cfg)
    assert cfg.taps == (2, 5)
    f, aux = torch.randn(3, 16), torch.randn(3, 2, 16)
    assert torch.equal(head.entry(f, aux), f)
    assert torch.equal(FeatureHead(HeadConfig(16, 8, 10)).entry(f, None), f)


@pytest.fixture(scope="module")
def trained(q4k, recorded):
    cfg = TrainConfig(taps=TAPS, inner=128, vocab=VOCAB, epochs=30, batch=64, negatives=32, lr=3e-3, holdout=0.2)
    return train_head(recorded, q4k.embed, output_weight(q4k, VOCAB), cfg, log=lambda *a: None)


def test_training_learns_to_read_the_taps(q4k, recorded, trained):
    head, report = trained
    assert head.cfg.taps == TAPS and report["steps"] > 0
    H = q4k.spec.hidden_size
    assert head.fuse.weight[:, :len(TAPS) * H].abs().max() > 0  # the tapped part grew from zero
    no_taps = FeatureSet(recorded.features, recorded.tokens, recorded.top, recorded.starts)
    with pytest.raises(ValueError, match="taps"):
        train_head(no_taps, q4k.embed, output_weight(q4k, VOCAB), TrainConfig(taps=TAPS, epochs=1))


def test_head_with_taps_round_trips(tmp_path, trained):
    head, _ = trained
    head.save(tmp_path / "h")
    back = load_head(tmp_path / "h")
    assert back.cfg == head.cfg
    f, aux = torch.randn(2, head.cfg.hidden_size), torch.randn(2, len(TAPS), head.cfg.hidden_size)
    # weights are stored in bf16
    torch.testing.assert_close(back.entry(f, aux), head.entry(f, aux), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("method", ["head", "hybrid-head", "fusion"])
def test_greedy_with_a_tapped_head_equals_plain(q4k, trained, method):
    head, _ = trained
    greedy_runs_equal_plain(q4k, method, head, PROMPTS)


def test_the_drafter_gets_the_tapped_rows_and_fuses_them(q4k, trained, monkeypatch):
    from specdraft.drafters.feature_head import FeatureHeadDrafter

    head, _ = trained
    seen = []
    real = FeatureHeadDrafter.take_features

    def spy(self, hidden):
        seen.append(hidden.shape[-1])
        real(self, hidden)
        k, H = len(TAPS), head.cfg.hidden_size
        last = hidden[-1].float()
        want = head.entry(last[None, k * H:], last[None, :k * H].view(1, k, H))[0]
        # F runs as an int8 copy (a few % off); rows split the wrong way would be ~100% off
        assert (self.feature - want).norm() <= 0.1 * want.norm()

    monkeypatch.setattr(FeatureHeadDrafter, "take_features", spy)
    drafted(q4k, "head", PROMPTS[1], head, n=12)
    assert seen and set(seen) == {(len(TAPS) + 1) * q4k.spec.hidden_size}


def test_the_drafter_fuses_a_row_only_when_a_draft_reads_it(q4k, trained, monkeypatch):
    from specdraft.drafters.feature_head import FeatureHeadDrafter

    head, _ = trained
    drafter = FeatureHeadDrafter(q4k, head)
    real, fused = drafter.fused, []
    monkeypatch.setattr(drafter, "fused", lambda rows: fused.append(rows.shape[0]) or real(rows))
    q4k.reset()
    out = q4k.forward(torch.tensor(PROMPTS[0]), need_hidden=True, taps=TAPS)
    rows = torch.cat([out.taps.flatten(1), out.hidden], -1)  # as the engine hands them over
    drafter.begin(PROMPTS[0])
    assert not drafter.ready()
    drafter.take_features(rows)
    drafter.take_features(rows[:-1])  # a newer step's rows before any draft: the older row is never fused
    assert fused == [] and drafter.ready()
    want = real(rows[-2:-1])[0]
    assert torch.equal(drafter.feature, want) and fused == [1]
    assert torch.equal(drafter.feature, want) and fused == [1]  # fused once
    drafter.begin(PROMPTS[1])
    assert not drafter.ready() and drafter.feature is None


def test_a_head_with_taps_can_start_from_a_plain_heads_step(q4k, recorded):
    from specdraft.heads.train import start_from

    plain, _ = train_head(recorded, q4k.embed, output_weight(q4k, VOCAB),
                          TrainConfig(inner=64, vocab=VOCAB, epochs=2, batch=64, negatives=32), log=lambda *a: None)
    tapped = FeatureHead(HeadConfig(q4k.spec.hidden_size, 64, VOCAB, taps=TAPS))
    start_from(tapped, plain)
    rows = torch.arange(8)
    f, e = recorded.features[rows].float(), q4k.embed[recorded.tokens[rows + 1]].float()
    with torch.no_grad():  # taps fused as "take the last layer" until trained: the plain head exactly
        assert torch.equal(tapped(tapped.entry(f, recorded.aux[rows].float()), e), plain(f, e))
    other_vocab = FeatureHead(HeadConfig(q4k.spec.hidden_size, 64, VOCAB // 2))
    start_from(other_vocab, plain)  # the step predicts a feature: any rows of the output head read it
    assert torch.equal(other_vocab.w1.weight, plain.w1.weight)
    with pytest.raises(ValueError, match="inner 64"):
        start_from(FeatureHead(HeadConfig(q4k.spec.hidden_size, 32, VOCAB)), plain)


def test_a_head_goes_on_from_a_tapped_head_with_its_fusion(q4k, trained, recorded):
    from specdraft.heads.train import start_from

    head, _ = trained
    assert head.fuse.weight[:, :len(TAPS) * head.cfg.hidden_size].abs().max() > 0  # it learned to read the taps
    again = FeatureHead(head.cfg)
    start_from(again, head)
    rows = torch.arange(8)
    f, aux = recorded.features[rows].float(), recorded.aux[rows].float()
    with torch.no_grad():  # the same taps: the fusion comes too, so it starts as the head itself
        assert torch.equal(again.entry(f, aux), head.entry(f, aux))
    other_taps = FeatureHead(HeadConfig(head.cfg.hidden_size, head.cfg.inner, VOCAB, taps=TAPS[:1]))
    start_from(other_taps, head)  # other taps: only the step, and F starts as "take the last layer"
    assert torch.equal(other_taps.w1.weight, head.w1.weight)
    with torch.no_grad():
        assert torch.equal(other_taps.entry(f, aux[:, :1]), f)


def test_train_drafter_init_goes_on_with_the_heads_taps_vocabulary_and_width(tmp_path):
    """``train-drafter --kind mlp --init DIR``: what is not asked for otherwise is the head's own."""
    from _tiny import make_cli_model
    from specdraft.cli import main

    tiny = make_cli_model(tmp_path / "tiny")
    model = LlamaModel.from_dir(tiny, dtype=torch.float32, max_length=256)
    record(model, own_texts(model, n=6, length=30), taps=(0,)).save(tmp_path / "f.pt")
    common = ["train-drafter", "--kind", "mlp", "--target", str(tiny), "--features", str(tmp_path / "f.pt"),
              "--answer-minutes", "0", "--epochs", "1", "--batch", "16"]
    assert main([*common, "--out", str(tmp_path / "h0"), "--taps", "0", "--vocab", "24", "--inner", "40"]) == 0
    first = load_head(tmp_path / "h0")
    assert main([*common, "--out", str(tmp_path / "h1"), "--init", str(tmp_path / "h0")]) == 0
    second = load_head(tmp_path / "h1")
    assert second.cfg.taps == (0,) and second.cfg.inner == 40 and second.cfg.listed_vocab
    assert torch.equal(second.token_ids(), first.token_ids())
    assert main([*common, "--out", str(tmp_path / "h2"), "--init", str(tmp_path / "h0"), "--vocab", "12"]) == 0
    assert load_head(tmp_path / "h2").cfg.vocab == 12  # asked for: a vocabulary of its own, ranked again


def test_answers_keep_their_requests_and_are_recorded_again_with_taps(q4k, tmp_path):
    from specdraft.heads.data import record_again

    answers = record_answers(q4k, PROMPTS, max_new_tokens=10)
    assert answers.aux is None and answers.context_starts.tolist()[-1] == sum(len(p) - 1 for p in PROMPTS)
    docs = answers.documents()
    assert [d[:len(p)] for d, p in zip(docs, PROMPTS)] == PROMPTS  # request, then the answer's rows
    answers.save(tmp_path / "a.pt")
    back = FeatureSet.load(tmp_path / "a.pt")
    assert back.documents() == docs
    again = record_again(q4k, back, taps=TAPS)
    assert torch.equal(again.tokens, answers.tokens) and torch.equal(again.starts, answers.starts)
    assert again.documents() == docs and again.taps == TAPS
    # teacher-forced in one block against decoded row by row: the same features up to rounding
    torch.testing.assert_close(again.features.float(), answers.features.float(), rtol=0.02, atol=0.02)
    d = 1
    q4k.reset()
    out = q4k.forward(torch.tensor(docs[d]), need_hidden=True, taps=TAPS)
    n = int(answers.starts[d + 1] - answers.starts[d])
    assert torch.equal(again.aux[int(answers.starts[d]):int(answers.starts[d + 1])], out.taps[-n:].to(torch.float16))
    both = concat([again, again])
    assert both.documents() == docs + docs
    old = FeatureSet(answers.features, answers.tokens, answers.top, answers.starts)
    with pytest.raises(ValueError, match="without its documents' contexts"):
        record_again(q4k, old, taps=TAPS)


def test_answers_are_recorded_again_with_their_requests_rows(q4k, tmp_path):
    """with_requests: every row of each document kept, the request's first (request_rows), its
    answer's rows as recorded; answers_only gives the answer set back; the rows round-trip a
    file and concat keeps them."""
    from specdraft.heads.data import with_requests

    answers = record_answers(q4k, PROMPTS, max_new_tokens=10, taps=TAPS)
    full = with_requests(q4k, answers)
    assert full.request_rows.tolist() == [len(p) - 1 for p in PROMPTS] and full.taps == TAPS
    assert len(full) == len(answers) + sum(len(p) - 1 for p in PROMPTS) and full.documents() == answers.documents()
    q4k.reset()
    out = q4k.forward(torch.tensor(PROMPTS[0]), need_hidden=True, taps=TAPS)
    n = len(PROMPTS[0]) - 1  # the request's rows: the target's features at those positions
    assert torch.equal(full.features[:n], out.hidden[:n].to(torch.float16))
    assert torch.equal(full.aux[:n], out.taps[:n].to(torch.float16))
    full.save(tmp_path / "r.pt")
    back = FeatureSet.load(tmp_path / "r.pt")
    assert torch.equal(back.request_rows, full.request_rows)
    plain = back.answers_only()
    assert plain.request_rows is None and plain.documents() == answers.documents()
    assert torch.equal(plain.tokens, answers.tokens) and torch.equal(plain.starts, answers.starts)
    assert torch.equal(plain.top[:, 0], answers.top[:, 0])
    torch.testing.assert_close(plain.features.float(), answers.features.float(), rtol=0.02, atol=0.02)
    assert answers.answers_only() is answers
    assert concat([full, answers]).request_rows.tolist() == full.request_rows.tolist() + [0] * len(PROMPTS)


def test_train_drafter_with_requests_records_them_once_and_trains_the_layer(tmp_path, capsys):
    """``train-drafter --kind eagle --with-requests``: the answer set is recorded again with its
    requests' rows into NAME.requests.pt, which a later run reuses."""
    from _tiny import make_cli_model
    from specdraft.cli import main

    tiny = make_cli_model(tmp_path / "tiny")
    model = LlamaModel.from_dir(tiny, dtype=torch.float32, max_length=256)
    record_answers(model, PROMPTS * 3, max_new_tokens=12).save(tmp_path / "a.pt")
    common = ["train-drafter", "--kind", "eagle", "--target", str(tiny), "--answers", str(tmp_path / "a.pt"),
              "--with-requests", "--record-minutes", "0", "--answer-minutes", "0", "--epochs", "1", "--inner", "32"]
    assert main([*common, "--out", str(tmp_path / "e0")]) == 0
    full = FeatureSet.load(tmp_path / "a.requests.pt")
    assert full.request_rows.tolist() == [len(p) - 1 for p in PROMPTS * 3]
    assert main([*common, "--out", str(tmp_path / "e1")]) == 0
    assert "with their requests: " + str(len(full)) + " positions from" in capsys.readouterr().out
    assert load_head(tmp_path / "e1", "eagle").cfg.hidden_size == model.spec.hidden_size


def test_drafters_of_one_head_share_their_matrices_until_the_head_changes(q4k, trained):
    from specdraft.drafters.feature_head import FeatureHeadDrafter

    head, _ = trained
    a, b = FeatureHeadDrafter(q4k, head), FeatureHeadDrafter(q4k, head)
    # made once: the output rows gathered, the step and the fusion quantized (answers decoded together)
    assert b.out is a.out and b.fuse is a.fuse and b.step.w1 is a.step.w1 and b.step.w2 is a.step.w2
    z = torch.randn(1, head.w1.in_features)
    before = a.step.w1(z)
    with torch.no_grad():
        head.w1.weight.mul_(2.0)  # changed in place: its matrix is made again
    try:
        c = FeatureHeadDrafter(q4k, head)
        assert c.step.w1 is not a.step.w1 and c.step.w2 is a.step.w2 and c.out is a.out
        bias = head.w1.bias.detach()
        torch.testing.assert_close(c.step.w1(z) - bias, 2 * (before - bias), rtol=0.02, atol=1e-3)
    finally:
        with torch.no_grad():
            head.w1.weight.div_(2.0)
