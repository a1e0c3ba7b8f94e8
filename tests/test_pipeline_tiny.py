"""The high-level API (Speculator, specdraft.generate / stream) on a tiny model directory.

(Imported from the submodules: specdraft.generate is pipeline.generate.)
"""
from __future__ import annotations

import pytest
import torch

from _tiny import make_cli_model
from specdraft import pipeline
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.errors import TokenizerMismatchError
from specdraft.pipeline import Speculator

PROMPT = "abcabcabd abcab"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(make_cli_model(tmp_path_factory.mktemp("pipe") / "tiny"))


@pytest.fixture(scope="module")
def sd(tiny_dir):
    return Speculator(tiny_dir, tiny_dir, dtype="fp32", draft_format="w8a8", target_format="w8a8", max_length=256, progress=False)


@pytest.fixture(scope="module")
def plain(sd):
    return sd.generate(PROMPT, spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=30), chat=False)


def test_plain_result_is_consistent(sd, plain):
    assert plain.stats.method == "none" and plain.stats.drafts == 0
    assert len(plain.token_ids) == len(plain.origins) == plain.stats.new_tokens
    assert set(plain.origins) == {"target"}
    assert plain.prompt_ids == sd.encode_prompt(PROMPT, chat=False)


@pytest.mark.parametrize("method, trees", [("draft-model", False), ("draft-model", True), ("prompt-lookup", True)])
def test_speculator_methods_equal_plain(sd, plain, method, trees):
    spec = SpecConfig(method=method, k=4, ngram_min=1, min_confidence=0.0, cost_rule=False, trees=trees)
    res = sd.generate(PROMPT, spec=spec, gen=GenerationConfig(max_new_tokens=30), chat=False)
    assert res.token_ids == plain.token_ids and res.text == plain.text
    assert res.stats.drafts > 0 and res.stats.draft_tokens > 0
    assert res.origins.count("draft") == res.stats.accepted_tokens
    if method == "draft-model" and not trees:
        assert res.stats.acceptance_rate == 1.0  # the draft is the same model
    elif method == "draft-model":  # a tree's siblings fail, its likeliest first guess never does
        assert res.stats.accepted_tokens >= res.stats.drafts


def test_a_drafter_is_kept_across_requests_and_stays_exact(sd, plain):
    """One drafter per speculation config: what it learnt (here prompt lookup's pass rates by copy
    position) carries over to the next request, which still equals plain decoding."""
    spec = SpecConfig(method="prompt-lookup", k=4, ngram_min=1)
    first = sd.generate(PROMPT, spec=spec, gen=GenerationConfig(max_new_tokens=30), chat=False)
    drafter = sd.engine(spec).drafter
    tried = sum(drafter.rates.tried)
    assert first.token_ids == plain.token_ids and tried > 3.0 * drafter.rates.SIZE  # it learnt something
    second = sd.generate(PROMPT, spec=spec, gen=GenerationConfig(max_new_tokens=30), chat=False)
    assert second.token_ids == plain.token_ids and sd.engine(spec).drafter is drafter
    assert sum(drafter.rates.tried) > tried
    other = SpecConfig(method="prompt-lookup", k=3, ngram_min=1)
    assert sd.generate(PROMPT, spec=other, gen=GenerationConfig(max_new_tokens=30), chat=False).token_ids == plain.token_ids
    assert sd.engine(other).drafter is not drafter  # another config, another drafter
    for k in range(1, pipeline.KEPT_DRAFTERS + 1):  # as many more configs: the oldest one goes
        sd.engine(SpecConfig(method="prompt-lookup", k=k, ngram_min=2))
    assert sd.engine(spec).drafter is not drafter and len(sd._drafters) == pipeline.KEPT_DRAFTERS


def test_token_id_prompt_is_used_as_is(sd, plain):
    res = sd.generate(list(plain.prompt_ids), spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=30))
    assert res.token_ids == plain.token_ids


def test_stream_yields_the_same_text(sd, plain):
    pieces = list(sd.stream(PROMPT, spec=SpecConfig(method="prompt-lookup", ngram_min=1), gen=GenerationConfig(max_new_tokens=30),
                            chat=False))
    assert "".join(p.text for p in pieces) == plain.text
    assert sd.last_engine.stats.new_tokens == 30


def test_module_level_generate_and_stream(tiny_dir, plain):
    res = pipeline.generate(PROMPT, target=tiny_dir, draft=tiny_dir, method="draft-model", k=3, max_new_tokens=30,
                             chat=False, cost_rule=False, dtype="fp32", target_format="w8a8", draft_format="w8a8")
    assert res.token_ids == plain.token_ids and res.stats.drafts > 0
    text = "".join(p.text for p in pipeline.stream(PROMPT, target=tiny_dir, method="prompt-lookup",
                                                    max_new_tokens=30, chat=False, dtype="fp32"))
    assert text == plain.text


def test_module_level_generate_with_sampling_is_reproducible(tiny_dir):
    kw = dict(target=tiny_dir, method="prompt-lookup", max_new_tokens=20, chat=False, dtype="fp32", ngram_min=1,
              temperature=0.9, top_k=20, top_p=0.95, seed=11)
    assert pipeline.generate(PROMPT, **kw).token_ids == pipeline.generate(PROMPT, **kw).token_ids


def test_module_level_stop_string(tiny_dir, plain):
    """stop="xy" (a plain string) means the one stop string "xy", not the stop strings "x" and "y"."""
    full = plain.text
    # a two-character stop string whose first character already occurs earlier in the text
    i = next(i for i in range(2, len(full) - 1) if full[i] in full[:i] and full.find(full[i:i + 2]) == i)
    stop = full[i:i + 2]
    kw = dict(target=tiny_dir, method="none", max_new_tokens=30, chat=False, dtype="fp32")
    assert pipeline.generate(PROMPT, stop=(stop,), **kw).text == full[:i]
    assert pipeline.generate(PROMPT, stop=[stop], **kw).text == full[:i]
    assert pipeline.generate(PROMPT, stop=stop, **kw).text == full[:i]


def test_tokenizer_mismatch_is_refused(tiny_dir, tmp_path):
    other = str(make_cli_model(tmp_path / "other", seed=1, shuffle_seed=3))
    with pytest.raises(TokenizerMismatchError):
        Speculator(tiny_dir, other, dtype="fp32", max_length=64, progress=False)


def test_sampling_config_passes_through(sd):
    cfg = SamplingConfig(temperature=1.0, seed=5)
    spec = SpecConfig(method="draft-model", k=4, cost_rule=False)  # drafts that never follow timings: repeatable
    a = sd.generate(PROMPT, spec=spec, sampling=cfg, gen=GenerationConfig(max_new_tokens=20), chat=False)
    b = sd.generate(PROMPT, spec=spec, sampling=cfg, gen=GenerationConfig(max_new_tokens=20), chat=False)
    assert a.token_ids == b.token_ids
    assert a.stats.acceptance_rate == 1.0


@pytest.mark.parametrize("vocab, rows", [(96, 96), (2 * pipeline.DEFAULT_DRAFT_VOCAB, pipeline.DEFAULT_DRAFT_VOCAB)])
def test_a_draft_model_reads_the_first_ids_only_where_its_vocabulary_is_large(tmp_path, vocab, rows):
    """head_vocab "auto" (the Speculator's default for its draft): logits over DEFAULT_DRAFT_VOCAB
    ids where the vocabulary holds at least twice as many, else over every id; a target always
    over every id."""
    from _tiny import build_hf, save

    directory = save(build_hf(vocab=vocab), tmp_path / "m")
    draft = pipeline.load_model(str(directory), dtype="fp32", draft=True, head_vocab="auto", progress=False).model
    assert draft.forward(torch.tensor([1, 2, 3]), last_only=True).logits.shape == (1, rows)
    target = pipeline.load_model(str(directory), dtype="fp32", progress=False).model
    assert target.forward(torch.tensor([1, 2, 3]), last_only=True).logits.shape == (1, vocab)
    # with the target's frequent choices: those ids first, then the lowest others, as many
    frequent = torch.tensor([vocab - 1, 5, rows + 3])
    listed = pipeline.load_model(str(directory), dtype="fp32", draft=True, head_vocab="auto", frequent=frequent,
                                 progress=False).model
    if rows == vocab:  # a small vocabulary: every id, no list
        assert listed.vocab_ids is None
    else:
        want = sorted({*frequent.tolist(), *range(rows - 2)})
        assert listed.vocab_ids.tolist() == want and len(want) == rows
        assert listed.forward(torch.tensor([1, 2, 3, 4]), last_only=True).logits.shape == (1, rows)
