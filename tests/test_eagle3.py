"""EAGLE-3's layer (heads.eagle form "eagle3", drafters.eagle) on a tiny random target.

Trained in-process on the 4-layer tiny target's own greedy text with three taps and a
frequency-ranked vocabulary: it must start as its last tap read through the target's final norm,
learn, round-trip its files, let the drafter see what training showed it, and decode exactly.
"""
from __future__ import annotations

import pytest
import torch

from _tiny import VOCAB, build_hf, eagle_round_trip_decodes, load_native, own_texts, save, tapped_unroll_and_chain
from specdraft.drafters.feature_head import output_weight
from specdraft.heads.data import record
from specdraft.heads.eagle import Eagle3Head, EagleConfig
from specdraft.heads.eagle_train import EagleTrainConfig, TargetShape, _gather, agreement, stretches, train_eagle, unrolled
from specdraft.heads.model import load_head, rms
from specdraft.heads.vocab import as_draft_indices, choice_counts, frequent_ids

PROMPTS = [[5, 17, 33, 2, 5, 17, 33, 8], [41, 5, 17, 60, 3], [9, 9, 1, 70, 12, 30]]
TAPS = (0, 1, 2)  # of the 4-layer tiny target: a low, a middle and a late layer


@pytest.fixture(scope="module")
def eagle3(tmp_path_factory):
    model = load_native(save(build_hf("qwen2", seed=3, layers=4), tmp_path_factory.mktemp("eagle3") / "target"))
    data = record(model, own_texts(model), taps=TAPS)
    ids = frequent_ids(choice_counts(data.top, VOCAB), VOCAB // 2)
    cfg = EagleTrainConfig(form="eagle3", taps=TAPS, inner=64, vocab=len(ids), epochs=30, rows=256, chunk=64,
                           negatives=16, lr=3e-3, holdout=0.2)
    head, report = train_eagle(data, model.embed, output_weight(model, ids), TargetShape.of(model.spec), cfg,
                               log=lambda *a: None, vocab_ids=ids, init=model.norm)
    return model, data, head, report, ids


def test_it_starts_as_its_last_tap_through_the_final_norm(eagle3):
    """fc takes the last tap alone and attention and MLP start at zero: step 0's readout is
    rms(a^k) * the target's final-norm weight, at every row."""
    model, data, head, _, ids = eagle3
    fresh = Eagle3Head(head.cfg)
    fresh.start_as_last_tap(model.norm)
    feats, tokens, _, pos, lengths, aux, _ = _gather(data, [(0, int(data.starts[1]), 0)], data.top, taps=True)
    with torch.no_grad():
        h0 = unrolled(fresh, feats, tokens, pos, lengths, model.embed, 1, aux)[0][0]
    torch.testing.assert_close(h0[0], rms(aux[0, :-1, -1], head.cfg.eps) * model.norm.float(), atol=1e-5, rtol=1e-5)


def test_it_learns_round_trips_and_decodes_exactly(eagle3, tmp_path):
    model, data, head, report, ids = eagle3
    assert report["finished"] and len(report["val_agreement"]) == 3
    items = stretches(data, torch.arange(len(data.starts) - 1), 64)
    w, top = output_weight(model, ids), as_draft_indices(data.top.long(), len(ids), ids)
    untrained = Eagle3Head(head.cfg)
    untrained.start_as_last_tap(model.norm)
    got = agreement(head, data, items, model.embed, w, 3, top)
    base = agreement(untrained.eval(), data, items, model.embed, w, 3, top)
    assert got[0] > base[0] + 0.12 and got[2] > base[2] + 0.1, (got, base)
    eagle_round_trip_decodes(model, head, tmp_path / "eagle3", Eagle3Head, ids, PROMPTS)


def test_the_drafter_sees_what_training_showed(eagle3):
    """The drafter's cache of fused real rows and its chain steps (carrying h unnormed) give the
    training unroll's outputs once read out."""
    model, data, head, _, _ = eagle3
    want, got = tapped_unroll_and_chain(model, data, head)
    for j in range(3):
        torch.testing.assert_close(head.readout(got[j]), want[j], atol=1e-4, rtol=1e-4)


def test_the_form_needs_taps():
    with pytest.raises(ValueError, match="give taps"):
        EagleConfig(hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4, inner=8, vocab=8, form="eagle3")


def test_train_drafter_and_export_from_the_command_line(tmp_path, capsys):
    """``train-drafter --kind eagle --taps``: an EAGLE-3 layer with a frequency-ranked vocabulary;
    ``export --to vllm`` and ``--to sglang`` write it, the target's output-head rows included."""
    import json

    from safetensors.torch import load_file

    from _tiny import make_cli_model
    from specdraft.cli import main
    from specdraft.models.llama import LlamaModel
    from specdraft.pipeline import Speculator

    tiny = make_cli_model(tmp_path / "tiny")
    model = LlamaModel.from_dir(tiny, dtype=torch.float32, max_length=256)
    record(model, own_texts(model, n=6, length=30), taps=(0,)).save(tmp_path / "f.pt")  # 2 layers: one tap
    assert main(["train-drafter", "--kind", "eagle", "--taps", "0", "--target", str(tiny), "--features",
                 str(tmp_path / "f.pt"), "--answer-minutes", "0", "--epochs", "1", "--vocab", "24", "--inner", "32",
                 "--out", str(tmp_path / "e3")]) == 0
    head = load_head(tmp_path / "e3", "eagle")
    rows = output_weight(Speculator(str(tiny), dtype="fp32", runtime="native", max_length=64, load_draft=False)
                         .target.model, head.token_ids())  # the output head as the target runs it
    assert isinstance(head, Eagle3Head) and head.cfg.taps == (0,) and head.cfg.listed_vocab and head.cfg.vocab == 24
    for to, prefix in (("vllm", "layers.0."), ("sglang", "midlayer.")):
        assert main(["export", str(tmp_path / "e3"), "--to", to, "--target", str(tiny), "--out", str(tmp_path / to)]) == 0
        tensors = load_file(str(tmp_path / to / "model.safetensors"))
        assert prefix + "hidden_norm.weight" in tensors
        torch.testing.assert_close(tensors["lm_head.weight"].float(), rows.to(torch.bfloat16).float())
        config = json.loads((tmp_path / to / "config.json").read_text())
        assert config["draft_vocab_size"] == 24
    capsys.readouterr()
    assert main(["train-drafter", "--kind", "eagle", "--taps", "0", "--start", "random", "--target", str(tiny),
                 "--features", str(tmp_path / "f.pt"), "--out", str(tmp_path / "bad")]) == 2
    assert "--start applies to --kind eagle without --init or --taps" in capsys.readouterr().err
