"""Several sequences decoded together in one KV cache (models.packed), and what records and
writes training data through it (heads.data.record_answers, heads.requests.sample_continuations),
on a tiny random target (requests written in batches: test_self_requests); the bitwise claim on
the native kernels is in test_real_models."""
from __future__ import annotations

import pytest
import torch

from _tiny import VOCAB, chat_target
from specdraft.config import SamplingConfig
from specdraft.heads import requests
from specdraft.heads.data import record_answers, record_generation, record_generations
from specdraft.models.packed import decode_packed
from specdraft.sampling import make_generator


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return chat_target(tmp_path_factory.mktemp("packed") / "target")


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 1, (n,), generator=g).tolist() for n in lengths]


def greedy(i, logits):
    return int(logits.argmax())


def plain_greedy(model, prompt, n, eos=()):
    """Greedy decoding of one prompt alone, token by token."""
    model.reset()
    logits, new = model.forward(torch.tensor(prompt), last_only=True).logits[-1], []
    while len(new) < n:
        tok = int(logits.argmax())
        if tok in eos:
            break
        new.append(tok)
        logits = model.forward(torch.tensor([tok])).logits[-1]
    model.reset()
    return new


def test_packed_greedy_tokens_are_each_prompts_own(tiny):
    model, _ = tiny
    prompts = _prompts((5, 9, 1, 70, 3))  # 70: longer than a fused decoder block
    model.reset()
    model.forward(torch.tensor([1, 2, 3]))
    got = decode_packed(model, prompts, max_new_tokens=10, choose=greedy)
    assert model.length == 3  # the model's own cache is left as it was
    assert got == [plain_greedy(model, p, 10) for p in prompts]
    # an end-of-sequence id ends its sequence only, and is not kept
    eos = {got[1][3]}
    cut = decode_packed(model, prompts, max_new_tokens=10, choose=greedy, eos_ids=eos)
    assert cut == [plain_greedy(model, p, 10, eos) for p in prompts]
    assert cut[1] == got[1][:3]


def test_packing_splits_into_groups_that_fit(tiny, monkeypatch):
    from specdraft.models import packed

    model, _ = tiny
    prompts = _prompts((6, 8, 7, 5, 9), seed=1)
    monkeypatch.setattr(packed, "MAX_PACKED", 30)  # 6 + 8 new and 8 + 8 fit together; 7 + 8 and 5 + 8; 9 + 8
    groups = []
    decode_group = packed._decode_group

    def recording(cache, prompts, group, *a, **kw):
        groups.append((list(group), cache.max_length))
        return decode_group(cache, prompts, group, *a, **kw)

    monkeypatch.setattr(packed, "_decode_group", recording)
    got = decode_packed(model, prompts, max_new_tokens=8, choose=greedy)
    assert got == [plain_greedy(model, p, 8) for p in prompts]
    assert groups == [([0, 1], 30), ([2, 3], 28), ([4], 17)]  # each in a cache of its own, sized for it


def test_a_sequence_ends_at_the_models_length(tiny):
    model, _ = tiny
    short = model.with_cache(15)  # sequences of at most 15 tokens
    prompts = _prompts((5, 12, 15), seed=2)
    got = decode_packed(short, prompts, max_new_tokens=20, choose=greedy)
    assert [len(g) for g in got] == [10, 3, 0]  # 15 tokens each, the prompt included; 15 leaves no room
    assert got[:2] == [plain_greedy(model, p, 15 - len(p)) for p in prompts[:2]]


def test_packed_recording_is_the_one_by_one_recording(tiny):
    model, _ = tiny
    prompts = _prompts((4, 11, 66, 2), seed=3)
    one = [record_generation(model, p, 9, eos_ids={5}, taps=(0,)) for p in prompts]
    packed = record_generations(model, prompts, 9, eos_ids={5}, taps=(0,))
    for (t1, f1, p1, a1), (t2, f2, p2, a2) in zip(one, packed, strict=True):
        assert t1 == t2 and len(f1) == len(f2) == len(a1) == len(a2) == len(t1)
        assert all(torch.equal(x, y) for x, y in zip(p1, p2))  # the target's top candidates
        # the torch attention sums over the packed cache's length: equal to fp16 rounding here
        # (the native kernels give the same bits: test_real_models)
        assert all(torch.allclose(x.float(), y.float(), atol=2e-3) for x, y in zip(f1 + a1, f2 + a2))
    # record_answers: the same documents, in the prompts' order, whichever the batch
    a = record_answers(model, iter(prompts), max_new_tokens=9, eos_ids={5}, batch=1)
    b = record_answers(model, iter(prompts), max_new_tokens=9, eos_ids={5}, batch=3)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.top, b.top) and torch.equal(a.starts, b.starts)
    assert torch.equal(a.context, b.context) and torch.equal(a.context_starts, b.context_starts)
    assert torch.allclose(a.features.float(), b.features.float(), atol=2e-3)


def test_sampled_continuations_are_reproducible(tiny):
    model, _ = tiny
    prompts = _prompts((3, 6, 4), seed=4)
    hot = SamplingConfig(temperature=1.0)

    def sample(seed, ps):
        return requests.sample_continuations(model, ps, max_new_tokens=8, eos_ids=(), generator=make_generator(seed),
                                             sampling=hot)

    a = sample(0, prompts)
    assert a == sample(0, prompts) and a != sample(1, prompts)
    assert all(len(x) == 8 for x in a)
    # greedy: each continuation is the prompt's own, batched or not
    assert requests.sample_continuations(model, prompts, max_new_tokens=8, eos_ids=(), generator=make_generator(0),
                                         sampling=SamplingConfig()) == [plain_greedy(model, p, 8) for p in prompts]
