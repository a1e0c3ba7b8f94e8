"""A frequency-ranked draft vocabulary (heads.vocab, FR-Spec / EAGLE-3's d2t): the head guesses
among the ids the target chose most often, scored by those rows of the target's output head.

The ids are ranked by counts then by lowest id; the GGUF rows gathered for them give the bits
the whole matrix gives; a head trained on them keeps its ids through its files, and decoding
with it stays the target's own greedy output, its sampled guesses' q living on those ids only.
"""
from __future__ import annotations

import pytest
import torch
from test_gguf_kernels import quant_tensor

from _tiny import VOCAB, FakeTokenizer, build_hf, drafted, greedy_runs_equal_plain, own_texts, save
from specdraft.config import SamplingConfig
from specdraft.drafters.feature_head import FeatureHeadDrafter, output_rows, output_weight
from specdraft.heads.data import record
from specdraft.heads.model import FeatureHead, load_head
from specdraft.heads.train import TrainConfig, train_head
from specdraft.heads.vocab import choice_counts, draft_index, frequent_ids
from specdraft.models.gguf_weights import GGUFLinear
from specdraft.models.llama import LlamaModel

PROMPTS = [[5, 17, 33, 2, 5, 17, 33, 8], [41, 5, 17, 60, 3], [9, 9, 1, 70, 12, 30]]
SIZE = 40  # of VOCAB = 96 ids


def test_frequent_ids_rank_by_counts_then_lowest_id():
    counts = torch.tensor([0, 5, 0, 9, 5, 1, 0, 0])
    assert frequent_ids(counts, 3).tolist() == [1, 3, 4]  # 9, then the two 5s
    assert frequent_ids(counts, 5).tolist() == [0, 1, 3, 4, 5]  # then 1, then the lowest unseen id
    assert frequent_ids(counts, 20).tolist() == list(range(8))
    ids = torch.tensor([6, 2, 4])
    t2d = draft_index(ids, 8)
    assert t2d.tolist() == [-1, -1, 1, -1, 2, -1, 0, -1]
    assert choice_counts(torch.tensor([[3, 1], [3, 0], [7, 3]]), 8).tolist() == [0, 0, 0, 2, 0, 0, 0, 1]


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_selected_gguf_rows_are_the_matrix_rows_bit_for_bit(kind):
    from specdraft.kernels import KernelUnavailable, gguf_ops

    try:
        gguf_ops()
    except KernelUnavailable as e:
        pytest.skip(str(e))
    qt, _ = quant_tensor(kind, 43, 512, seed=7)
    ids = torch.tensor([42, 5, 0, 17, 17, 8, 3, 30, 31, 2, 1])  # any order, repeats, a partial last record
    picked = qt.select(ids)
    assert picked.out_features == len(ids) and torch.equal(picked.dequantize(), qt.dequantize()[ids])
    whole, some = GGUFLinear([qt]), GGUFLinear([qt]).select_rows(ids)
    x = torch.randn(5, 512)
    assert torch.equal(some(x), whole(x)[:, ids])


@pytest.fixture(scope="module", params=["dense", "q4k"])
def target_dir(request, tmp_path_factory):
    if request.param == "q4k":
        from specdraft.kernels import KernelUnavailable, gguf_ops

        try:
            gguf_ops()
        except KernelUnavailable as e:
            pytest.skip(str(e))
    return save(build_hf("qwen2", seed=0), tmp_path_factory.mktemp("vocab") / "target"), request.param


@pytest.fixture(scope="module")
def target(target_dir):
    d, fmt = target_dir
    return LlamaModel.from_dir(d, dtype=torch.float32, max_length=256, weight_format=fmt)


@pytest.fixture(scope="module")
def listed_draft(target_dir):
    """The target's own weights as a draft model whose output head lists LISTED's ids."""
    d, fmt = target_dir
    return LlamaModel.from_dir(d, dtype=torch.float32, max_length=256, weight_format=fmt, head_vocab=LISTED)


# ids a draft model's output head lists: not the first ones, so an index is never its id
LISTED = torch.tensor([1, 2, 5, 8, 9, 12, 17, 30, 31, 33, 41, 60, 64, 70, 71, 80, 95])


@pytest.fixture(scope="module")
def trained(target):
    data = record(target, own_texts(target))
    ids = frequent_ids(choice_counts(data.top, VOCAB), SIZE)
    cfg = TrainConfig(inner=128, vocab=SIZE, epochs=30, batch=64, negatives=32, lr=3e-3, holdout=0.2)
    head, report = train_head(data, target.embed, output_weight(target, ids), cfg, log=lambda *a: None, vocab_ids=ids)
    return data, ids, head, report


def test_a_head_trains_on_its_listed_ids_and_keeps_them(target, trained, tmp_path):
    data, ids, head, report = trained
    assert head.cfg.listed_vocab and torch.equal(head.token_ids(), ids) and report["steps"] > 0
    t2d = draft_index(ids, VOCAB)
    assert (t2d[data.top[:, 0]] >= 0).float().mean() > 0.6  # the most frequent 40 of 96 ids hold most choices
    w = output_weight(target, ids)
    last = torch.zeros(len(data), dtype=torch.bool)
    last[data.starts[1:] - 1] = True  # a document's last row has no next row in it
    rows = torch.arange(len(data))[~last]

    def agreement(h):  # the guess after one step, as a target id, against the target's choice
        with torch.no_grad():
            f = h(data.features[rows].float(), target.embed[data.tokens[rows + 1]].float())
            return float((ids[(f @ w.T).argmax(-1)] == data.top[rows + 1, 0]).float().mean())

    assert agreement(head) > agreement(FeatureHead(head.cfg).eval()) + 0.2
    head.save(tmp_path / "h")
    back = load_head(tmp_path / "h")
    assert back.cfg == head.cfg and back.vocab_ids.dtype == torch.int64 and torch.equal(back.token_ids(), ids)
    with pytest.raises(ValueError, match="listed vocabulary"):
        train_head(data, target.embed, output_weight(target, ids[:-1]), TrainConfig(vocab=SIZE, epochs=1), vocab_ids=ids)


def test_output_rows_are_those_of_the_listed_ids(target, trained):
    _, ids, _, _ = trained
    f = torch.randn(3, target.spec.hidden_size)
    want = output_rows(target, VOCAB)(f)[:, ids]
    torch.testing.assert_close(output_rows(target, ids)(f), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(output_weight(target, ids), output_weight(target, VOCAB)[ids])


@pytest.mark.parametrize("method", ["head", "hybrid-head"])
@pytest.mark.parametrize("trees", [False, True])
def test_greedy_with_a_listed_vocabulary_equals_plain(target, trained, method, trees):
    _, _, head, _ = trained
    greedy_runs_equal_plain(target, method, head, PROMPTS, trees=trees)


def test_guesses_and_their_q_are_target_ids(target, trained, monkeypatch):
    _, ids, head, _ = trained
    allowed = set(ids.tolist())
    seen = []
    real = FeatureHeadDrafter.propose

    def spy(self, context, k, sampling, generator):
        self.sample_from_q = True  # sampled guesses drawn from q (else their argmax, one-hot)
        draft = real(self, context, k, sampling, generator)
        seen.append(draft)
        return draft

    monkeypatch.setattr(FeatureHeadDrafter, "propose", spy)
    for sampling in (SamplingConfig(), SamplingConfig(temperature=0.8, seed=3)):
        drafted(target, "head", PROMPTS[0], head, sampling, n=20, trees=False)  # chains: sampled guesses carry q
    drafts = [d for d in seen if d.tokens]
    assert drafts and all(set(d.tokens) <= allowed for d in drafts)
    sampled = [d for d in drafts if d.probs is not None]
    assert sampled
    outside = torch.ones(len(target.embed), dtype=torch.bool)
    outside[ids] = False
    for d in sampled:
        assert d.probs.shape[-1] == len(target.embed)
        torch.testing.assert_close(d.probs.sum(-1), torch.ones(len(d.tokens)))
        assert d.probs[:, outside].abs().max() == 0
        assert all(d.probs[i, t] > 0 for i, t in enumerate(d.tokens))


def test_an_old_head_guesses_among_the_first_ids(target):
    head = FeatureHead(FeatureHead.__init__.__globals__["HeadConfig"](target.spec.hidden_size, 16, SIZE)).eval()
    assert not head.cfg.listed_vocab and torch.equal(head.token_ids(), torch.arange(SIZE))
    assert FeatureHeadDrafter(target, head).ids is None


def test_mtp_modules_take_a_listed_vocabulary(target, trained, tmp_path):
    data, ids, _, _ = trained
    cfg = TrainConfig(inner=64, vocab=SIZE, epochs=4, batch=64, negatives=32, holdout=0.2)
    modules, _ = train_head(data, target.embed, output_weight(target, ids), cfg, log=lambda *a: None,
                            kind="mtp", vocab_ids=ids)
    assert modules.cfg.listed_vocab and torch.equal(modules.token_ids(), ids)
    modules.save(tmp_path / "m")
    back = load_head(tmp_path / "m", "mtp")
    assert back.cfg == modules.cfg and torch.equal(back.token_ids(), ids)
    greedy_runs_equal_plain(target, "mtp", back, PROMPTS)
    from specdraft.drafters.mtp import MTPDrafter

    assert torch.equal(MTPDrafter(target, back).ids, ids)


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_medusa_and_hydra_heads_take_a_listed_vocabulary(target, trained, kind, tmp_path):
    from specdraft.heads.export import medusa_tensors
    from specdraft.heads.medusa import MedusaTrainConfig, train_medusa

    data, ids, _, _ = trained
    cfg = MedusaTrainConfig(num_heads=3, vocab=SIZE, epochs=3, batch=64, negatives=32, holdout=0.2)
    heads, report = train_medusa(data, output_weight(target, ids), cfg, log=lambda *a: None, kind=kind,
                                 emb=target.embed, vocab_ids=ids)
    assert heads.cfg.listed_vocab and torch.equal(heads.token_ids(), ids) and report["steps"] > 0
    heads.save(tmp_path / kind)
    back = load_head(tmp_path / kind, kind)
    assert torch.equal(back.token_ids(), ids)
    greedy_runs_equal_plain(target, kind, back, PROMPTS)
    tensors = medusa_tensors(back, output_weight(target, ids))
    assert torch.equal(tensors["token_map"], ids) and tensors["lm_heads.0.weight"].shape[0] == SIZE


def test_train_drafter_ranks_its_vocabulary_on_the_training_documents_only():
    """An id only held-out documents choose is not ranked in: their agreement stays held out."""
    from specdraft.heads.command import training_vocab
    from specdraft.heads.data import FeatureSet
    from specdraft.heads.train import TrainConfig, split_documents

    cfg = TrainConfig(vocab=3, holdout=0.25, seed=0)
    starts = torch.tensor([0, 10, 20, 30, 40])
    val, train = split_documents(4, cfg.holdout, cfg.seed)
    top = torch.zeros(40, 16, dtype=torch.int64)
    for d in train.tolist():  # training documents choose 5, 6 and 7
        top[starts[d]:starts[d + 1], 0] = torch.tensor([5, 6, 7, 5, 6, 7, 5, 6, 7, 5])
    top[starts[val[0]]:starts[val[0] + 1], 0] = 9  # the held-out document chooses only 9
    data = FeatureSet(torch.zeros(40, 4).half(), torch.zeros(40, dtype=torch.int64), top, starts)
    assert training_vocab(data, cfg, 12).tolist() == [5, 6, 7]


# ------------------------------------------------------------------------------------ draft models

def test_a_listed_output_head_gives_the_logits_of_its_ids(target, listed_draft):
    ids = torch.tensor(PROMPTS[0])
    target.reset(), listed_draft.reset()
    full, some = target.forward(ids).logits, listed_draft.forward(ids).logits
    target.reset(), listed_draft.reset()
    assert torch.equal(listed_draft.vocab_ids, LISTED) and some.shape == (len(ids), len(LISTED))
    torch.testing.assert_close(some, full[:, LISTED], rtol=1e-5, atol=1e-5)
    for bad in (torch.tensor([3, 2]), torch.tensor([4, 4]), torch.tensor([-1, 2]), torch.tensor([2, VOCAB]),
                torch.tensor([], dtype=torch.int64)):
        with pytest.raises(ValueError, match="distinct ascending ids"):
            LlamaModel(target.spec, {}, None, head_vocab=bad)


def draft_engine(target, draft, **spec_kw):
    from specdraft.config import SpecConfig
    from specdraft.drafters import DrafterContext, build_drafter
    from specdraft.engine import Engine

    spec = SpecConfig(method="draft-model", k=4, min_confidence=0.0, cost_rule=False, **spec_kw)
    return Engine(target, FakeTokenizer(), build_drafter("draft-model", DrafterContext(spec, target, draft)), spec)


def recorded(engine) -> list:
    """The drafts ``engine``'s drafter proposes from now on (appended as they come)."""
    seen, real = [], engine.drafter.propose

    def propose(*args):
        seen.append(real(*args))
        return seen[-1]

    engine.drafter.propose = propose
    return seen


@pytest.mark.parametrize("trees", [False, True])
def test_a_draft_model_over_listed_ids_guesses_target_ids_and_stays_exact(target, listed_draft, trees):
    from specdraft.config import GenerationConfig

    allowed = set(LISTED.tolist())
    for prompt in PROMPTS:
        plain, _ = drafted(target, "none", prompt)
        e = draft_engine(target, listed_draft, trees=trees)
        assert e.drafter.ids is not None
        seen = recorded(e)
        e.generate(prompt, SamplingConfig(), GenerationConfig(max_new_tokens=40))
        assert list(e.token_ids) == plain
        guesses = [t for d in seen for t in d.tokens]
        assert guesses and set(guesses) <= allowed
        assert e.stats.accepted_tokens > 0  # the draft is the target itself: its guesses in LISTED pass


def test_a_draft_model_over_listed_ids_samples_q_on_those_ids(target, listed_draft):
    from specdraft.config import GenerationConfig

    e = draft_engine(target, listed_draft)
    seen = recorded(e)
    sampling = SamplingConfig(temperature=0.8, seed=3)
    e.generate(PROMPTS[1], sampling, GenerationConfig(max_new_tokens=40))
    first = list(e.token_ids)
    e.generate(PROMPTS[1], sampling, GenerationConfig(max_new_tokens=40))
    assert list(e.token_ids) == first  # seeded: repeatable
    sampled = [d for d in seen if d.tokens]
    assert sampled and all(d.probs is not None for d in sampled)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[LISTED] = False
    for d in sampled:
        assert d.probs.shape[-1] == VOCAB and set(d.tokens) <= set(LISTED.tolist())
        torch.testing.assert_close(d.probs.sum(-1), torch.ones(len(d.tokens)))
        assert d.probs[:, outside].abs().max() == 0
        assert all(d.probs[i, t] > 0 for i, t in enumerate(d.tokens))
