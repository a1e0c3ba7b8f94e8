"""Self-speculation (drafters/self_draft, LlamaModel.with_layers) on tiny 4-layer targets.

The copy must share the target's weights and keep a cache of its own, the layer choice must skip
the layer whose absence changes nothing (one whose output projections are zero), and decoding
must stay the target's own greedy output (dense and the native q4k kernels).
"""
from __future__ import annotations

import pytest
import torch

from _tiny import build_hf, greedy_runs_equal_plain, save, save_char_tokenizer
from specdraft.config import SpecConfig
from specdraft.drafters import DrafterContext, build_drafter, self_draft
from specdraft.errors import ParameterError
from specdraft.models.llama import LlamaModel

PROMPTS = [[5, 17, 33, 2, 5, 17, 33, 8], [41, 5, 17, 60, 3], [9, 9, 1, 70, 12, 30]]
IDS = torch.tensor([t for p in PROMPTS for t in p] * 2)  # what the layer choice is measured on here


def deep_target(directory, weight_format: str = "dense", idle_layer: int | None = 2):
    """A random 4-layer target; layer ``idle_layer`` adds nothing (its o and down projections are zero)."""
    if weight_format == "q4k":
        from specdraft.kernels import KernelUnavailable, gguf_ops

        try:
            gguf_ops()
        except KernelUnavailable as e:
            pytest.skip(str(e))
    model = build_hf("qwen2", seed=1, layers=4)
    if idle_layer is not None:
        with torch.no_grad():
            model.model.layers[idle_layer].self_attn.o_proj.weight.zero_()
            model.model.layers[idle_layer].mlp.down_proj.weight.zero_()
    d = save(model, directory)
    return LlamaModel.from_dir(d, dtype=torch.float32, max_length=256, weight_format=weight_format)


@pytest.fixture(scope="module", params=["dense", "q4k"])
def target(request, tmp_path_factory):
    return deep_target(tmp_path_factory.mktemp("self-draft") / "target", request.param)


def test_the_copy_shares_weights_and_keeps_its_own_cache(target):
    ids = torch.tensor(PROMPTS[0])
    target.reset()
    want = target.forward(ids).logits
    same = target.with_layers([0, 1, 2, 3])
    torch.testing.assert_close(same.forward(ids).logits, want, rtol=0, atol=0)
    short = target.with_layers([0, 3])
    assert short.layers[1] is target.layers[3] and short.lm_head is target.lm_head and short.embed is target.embed
    short.forward(ids[:3])
    assert (short.length, target.length) == (3, len(ids))
    assert not torch.equal(short.forward(ids[3:]).logits, want[3:])  # two layers fewer: other logits
    with pytest.raises(ValueError, match="ascending"):
        target.with_layers([2, 1])


def test_a_copy_sharing_the_cache_reads_the_targets_rows_and_writes_past_them(target):
    ids = torch.tensor(PROMPTS[0])
    target.reset()
    target.forward(ids[:5])
    before = [c[:, :5].clone() for c in target.k_cache]
    shared = target.with_layers([0, 1, 2, 3], share_cache=True)
    shared.length = target.length
    got = shared.forward(ids[5:]).logits  # rows 5.. attend to the target's rows 0..4
    assert all(torch.equal(c[:, :5], b) for c, b in zip(target.k_cache, before)) and target.length == 5
    torch.testing.assert_close(got, target.forward(ids[5:]).logits, rtol=0, atol=0)


def test_the_idle_layer_is_the_one_skipped(target):
    keep, agreement = self_draft.choose_layers(target, IDS, 1)
    assert keep == [0, 1, 3] and agreement == 1.0
    keep, agreement = self_draft.choose_layers(target, IDS, 2)
    assert len(keep) == 2 and 2 not in keep and 0.0 <= agreement <= 1.0
    with pytest.raises(ParameterError, match="between 1 and 3"):
        self_draft.choose_layers(target, IDS, 4)


def test_greedy_equals_plain_and_the_idle_copy_is_always_right(target, monkeypatch):
    monkeypatch.setattr(self_draft, "calibration_ids", lambda target_dir: IDS)
    fed = []
    forward = self_draft.SelfDraft._forward
    monkeypatch.setattr(self_draft.SelfDraft, "_forward", lambda self, ids: fed.append(len(ids)) or forward(self, ids))
    runs = greedy_runs_equal_plain(target, "self-draft", None, PROMPTS, skip_layers=1)
    # skipping the idle layer changes nothing: every guess passes
    assert all(s.accepted_tokens == s.draft_tokens for s in runs)
    assert set(fed) == {1}  # the copy reads the target's cache: never a prompt to catch up on
    runs = greedy_runs_equal_plain(target, "self-draft", None, PROMPTS, skip_layers=2)
    assert all(s.draft_tokens > 0 for s in runs)


def test_the_layer_choice_reads_the_targets_tokenizer(tmp_path):
    save_char_tokenizer(tmp_path)
    assert len(self_draft.calibration_ids(tmp_path)) > 100
    with pytest.raises(ParameterError, match=r"tokenizer\.json cannot be read"):
        self_draft.calibration_ids(tmp_path / "nowhere")


def test_targets_without_layers_are_refused():
    spec = SpecConfig(method="self-draft")
    with pytest.raises(ParameterError, match="native runtime"):
        build_drafter("self-draft", DrafterContext(spec, object(), None))
    with pytest.raises(ParameterError, match="skip-layers must be an integer >= 1"):
        SpecConfig(method="self-draft", skip_layers=0)


def test_the_measurement_is_kept_in_the_cache(target, tmp_path, monkeypatch):
    monkeypatch.setattr(self_draft, "cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(self_draft, "calibration_ids", lambda target_dir: IDS)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    self_draft._HARM.pop(target, None)
    first = self_draft._stored_harm(target, model_dir)
    assert len(first) == 4 and first[2] == 0.0
    (stored,) = (tmp_path / "cache" / "self-draft").glob("*.json")
    self_draft._HARM.pop(target)
    measured = []
    monkeypatch.setattr(self_draft, "layer_harm", lambda *a: measured.append(1) or first)
    assert self_draft._stored_harm(target, model_dir) == first and not measured  # read back
    self_draft._HARM.pop(target)
    stored.write_text("{not json")
    assert self_draft._stored_harm(target, model_dir) == first and measured  # corrupt: measured again
