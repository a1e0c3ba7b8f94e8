"""Requests the target writes itself (heads.requests, Magpie) on a tiny random target with a
character tokenizer and a made-up chat template."""
from __future__ import annotations

import random

import pytest
import torch

from _tiny import CHAT_TEMPLATE, VOCAB, chat_target
from specdraft.config import SamplingConfig
from specdraft.heads import requests
from specdraft.sampling import make_generator


@pytest.fixture(scope="module")
def model_and_tokenizer(tmp_path_factory):
    return chat_target(tmp_path_factory.mktemp("selfreq") / "target")


def test_user_turn_prefix_ends_where_the_message_begins(model_and_tokenizer):
    _, tok = model_and_tokenizer
    assert requests.user_turn_prefix(tok) == "<user>"


def test_continuation_is_the_models_own_and_stops_at_eos(model_and_tokenizer):
    model, _ = model_and_tokenizer
    greedy = SamplingConfig()
    prompt = [3, 1, 4, 1, 5]
    got = requests.sample_continuations(model, [prompt], max_new_tokens=6, eos_ids=(), generator=make_generator(0),
                                        sampling=greedy)[0]
    model.reset()
    ids, plain = list(prompt), []
    for _ in range(6):  # plain greedy decoding, without a cache
        plain.append(int(model.forward(torch.tensor(ids), last_only=True).logits[-1].argmax()))
        model.reset()
        ids.append(plain[-1])
    assert got == plain
    assert requests.sample_continuations(model, [prompt], max_new_tokens=6, eos_ids={plain[0]},
                                         generator=make_generator(0), sampling=greedy)[0] == []
    cut = requests.sample_continuations(model, [prompt], max_new_tokens=6, eos_ids={plain[2]},
                                        generator=make_generator(0), sampling=greedy)[0]
    assert cut == plain[:plain.index(plain[2])]


def test_self_requests_are_reproducible_varied_and_open_as_steered(model_and_tokenizer, monkeypatch):
    model, tok = model_and_tokenizer
    monkeypatch.setattr(requests, "MIN_REQUEST_CHARS", 3)
    monkeypatch.setattr(requests, "MAX_REQUEST_TOKENS", 12)
    monkeypatch.setattr(requests, "OPENERS", ("ab", "cd"))
    eos = {VOCAB - 1}
    a = list(requests.self_requests(model, tok, 8, seed=5, eos_ids=eos))
    b = list(requests.self_requests(model, tok, 8, seed=5, eos_ids=eos))
    c = list(requests.self_requests(model, tok, 8, seed=6, eos_ids=eos))
    assert a == b and a != c
    assert 0 < len(a) <= 8 and len(set(a)) > 1
    assert all(len(r) >= 3 for r in a)
    # every request opens with one of the steering openings and goes on with sampled text
    assert all(r[:2] in ("ab", "cd") and len(r) > 2 for r in a)
    assert {r[:2] for r in a} == {"ab", "cd"}


def test_passage_requests_wrap_a_passage_the_target_wrote(model_and_tokenizer, monkeypatch):
    model, tok = model_and_tokenizer
    monkeypatch.setattr(requests, "MIN_PASSAGE_CHARS", 3)
    monkeypatch.setattr(requests, "MAX_TOPIC_TOKENS", 4)
    monkeypatch.setattr(requests, "MAX_PASSAGE_TOKENS", 10)
    monkeypatch.setattr(requests, "PASSAGE_TASKS", (("ab", "T: {p}"), ("cd", "{p} Q: {q}")))
    eos = {VOCAB - 1}
    a = list(requests.passage_requests(model, tok, 8, seed=5, eos_ids=eos))
    assert a == list(requests.passage_requests(model, tok, 8, seed=5, eos_ids=eos))
    assert a != list(requests.passage_requests(model, tok, 8, seed=6, eos_ids=eos))
    assert 0 < len(a) <= 8
    wrapped = [r for r in a if r.startswith("T: ")]
    asked = [r for r in a if " Q: " in r]
    assert wrapped and asked and len(wrapped) + len(asked) == len(a)
    assert all(len(r.split(" Q: ")[1]) > 0 for r in asked)
    # the passage is the target's own sampled answer to the writing request: same seed, same text
    generator = requests.make_generator(5)
    opener, wrap = random.Random(5).choice(requests.PASSAGE_TASKS)
    topic = requests._first_lines(model, tok, ["<user>" + opener], max_new_tokens=4, eos_ids=eos, generator=generator)[0]
    passage = requests._answers(model, tok, [f"{opener} {topic}".strip()], eos_ids=eos, generator=generator)[0]
    assert topic and len(passage) >= 3 and wrap == "{p} Q: {q}"  # seed 5's first request (for this tiny model)
    question = requests._first_lines(model, tok, [f"<user>{passage}\n\nQuestion:"], max_new_tokens=4, eos_ids=eos,
                                     generator=generator)[0]
    assert question and a[0] == f"{passage} Q: {question}"


def _short_requests(monkeypatch, tasks) -> None:
    """Requests and passages a tiny model writes quickly, openings ab / cd, passage ``tasks``."""
    monkeypatch.setattr(requests, "MIN_REQUEST_CHARS", 3)
    monkeypatch.setattr(requests, "MAX_REQUEST_TOKENS", 12)
    monkeypatch.setattr(requests, "OPENERS", ("ab", "cd"))
    monkeypatch.setattr(requests, "MIN_PASSAGE_CHARS", 3)
    monkeypatch.setattr(requests, "MAX_TOPIC_TOKENS", 4)
    monkeypatch.setattr(requests, "MAX_PASSAGE_TOKENS", 10)
    monkeypatch.setattr(requests, "PASSAGE_TASKS", tasks)


def test_mixed_requests_put_a_passage_request_in_every_fourth_place(model_and_tokenizer, monkeypatch):
    model, tok = model_and_tokenizer
    _short_requests(monkeypatch, (("ef", "T: {p}"),))
    eos = {VOCAB - 1}
    mixed = list(requests.mixed_requests(model, tok, 8, seed=5, eos_ids=eos))
    plain = list(requests.self_requests(model, tok, 8, seed=5, eos_ids=eos))
    passages = list(requests.passage_requests(model, tok, 8, seed=5, eos_ids=eos))
    assert len(mixed) == 8 and len(plain) >= 6 and len(passages) >= 2
    assert mixed[3] == passages[0] and mixed[7] == passages[1] and mixed[3].startswith("T: ")
    assert mixed[:3] + mixed[4:7] == plain[:6]


def test_requests_written_in_batches_are_reproducible_and_varied(model_and_tokenizer, monkeypatch):
    """Several requests written together (models.packed) draw step by step in their order."""
    model, tok = model_and_tokenizer
    _short_requests(monkeypatch, (("ef", "T: {p}"), ("gh", "{p} Q: {q}")))
    eos = {VOCAB - 1}
    for write in (requests.self_requests, requests.passage_requests, requests.mixed_requests):
        a = list(write(model, tok, 9, seed=5, eos_ids=eos, batch=4))
        assert a == list(write(model, tok, 9, seed=5, eos_ids=eos, batch=4))
        assert a != list(write(model, tok, 9, seed=6, eos_ids=eos, batch=4))
        assert 0 < len(a) <= 9 and len(set(a)) > 1
    passages = list(requests.passage_requests(model, tok, 9, seed=5, eos_ids=eos, batch=4))
    assert any(r.startswith("T: ") for r in passages) and any(" Q: " in r for r in passages)
    assert all(r.startswith("T: ") or len(r.split(" Q: ")[1]) > 0 for r in passages)


def test_train_drafter_records_answers_to_the_targets_own_requests(tmp_path, capsys):
    from transformers import AutoTokenizer

    from _tiny import make_cli_model
    from specdraft.cli import main
    from specdraft.heads.data import FeatureSet

    tiny = make_cli_model(tmp_path / "tiny")
    common = ["train-drafter", "--kind", "mlp", "--target", str(tiny), "--record-minutes", "0", "--epochs", "1",
              "--batch", "8", "--requests", "self", "--answers", str(tmp_path / "a.pt"), "--answer-minutes", "0.03"]
    assert main([*common, "--out", str(tmp_path / "h0")]) == 2  # a model without a chat template: one line
    err = capsys.readouterr().err.strip()
    assert "--requests self needs a chat model" in err and "\n" not in err
    assert not (tmp_path / "a.pt").exists() and not (tmp_path / "h0").exists()
    tok = AutoTokenizer.from_pretrained(str(tiny))
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(tiny))
    assert main([*common, "--out", str(tmp_path / "h1")]) == 0
    answers = FeatureSet.load(tmp_path / "a.pt")
    assert len(answers.starts) > 1 and answers.context is not None
    prompt = tok.decode(answers.documents()[0])  # the template's user turn holds a request the model wrote
    assert prompt.startswith("<user>") and "[/]<assistant>" in prompt


def test_requests_auto_are_self_written_for_a_chat_model_and_templated_otherwise():
    import types

    from specdraft.errors import ParameterError
    from specdraft.heads.command import request_set
    from specdraft.heads.corpus import chat_requests

    class Tok:
        chat_template = None

    sd = types.SimpleNamespace(tokenizer=Tok(), target=types.SimpleNamespace(model=None, eos_ids=set()))
    assert request_set("auto", sd, 2) == chat_requests(5000, seed=2) == request_set("templates", sd, 2)
    Tok.chat_template = "{{ messages }}"
    auto = request_set("auto", sd, 2)
    assert isinstance(auto, types.GeneratorType) and auto.__name__ == "mixed_requests"  # lazily
    assert request_set("templates", sd, 2) == chat_requests(5000, seed=2)
    passages = request_set("passages", sd, 2)
    assert isinstance(passages, types.GeneratorType) and passages.__name__ == "passage_requests"
    assert request_set("self", sd, 2).__name__ == "self_requests"
    Tok.chat_template = None
    with pytest.raises(ParameterError, match="--requests passages needs a chat model"):
        request_set("passages", sd, 2)
