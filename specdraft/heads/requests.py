"""Requests the target writes itself (Magpie): the chat template up to where a user's message
begins, an opening word or two (or nothing), and the target samples the rest of a user's request.

A chat model's user turns are what it has seen most of in tuning, so its own requests spread over
far more kinds of asks than templates do; drafters trained on its answers to them guess better on
requests they never saw (templated requests teach the templates' style). The openings steer
towards the kinds of a chat workload (writing, roleplay, reasoning, maths, coding, extraction,
science, humanities, translation, summarization, questions); nothing here reads a benchmark's
prompts. Requests that carry a passage (translate it, summarize it, answer a question on it) take
one more step: the target writes the passage as its answer to a writing request it finished itself
(passage_requests); train-drafter's default mixes one of those into every four (mixed_requests).
"""
from __future__ import annotations

import random
from collections.abc import Iterator

import torch

from ..config import SamplingConfig
from ..models.packed import decode_packed
from ..sampling import make_generator, next_token

# "" lets the model choose the whole request; the rest steer it towards a kind of ask
OPENERS = ("", "", "", "Write", "Write a", "Compose", "Draft", "Imagine you are", "Pretend to be", "Act as",
           "Explain", "Why", "How", "What", "What is", "Describe", "Compare", "Can you", "Could you", "Please",
           "I", "I need", "Help me", "Tell me", "Give me", "List", "Suggest", "Solve", "Calculate", "Prove",
           "If", "Suppose", "A", "Given", "Translate", "Summarize", "Extract", "Rewrite", "Edit", "Classify",
           "In", "Who", "When", "Which", "Is it", "Create", "Implement", "Debug", "Design", "Plan")
SAMPLING = SamplingConfig(temperature=1.0, top_p=0.95)
MAX_REQUEST_TOKENS = 96
MIN_REQUEST_CHARS = 12

# Requests that carry a passage, the part of a chat workload the openings above rarely reach:
# translation into English, summarization, questions over a document. Each pair is (the opening
# of a writing request, the request that wraps the target's answer to it); "{q}" is a question
# about the passage, also written by the target.
PASSAGE_TASKS = (
    ("Schreibe einen kurzen Absatz auf Deutsch über", "Translate German to English: {p}"),
    ("Schreibe ein paar Sätze über", "Translate German to English: {p}"),
    ("Écris un court paragraphe en français sur", "Translate French to English: {p}"),
    ("Escribe un párrafo corto en español sobre", "Translate Spanish to English: {p}"),
    ("用中文写一段话，介绍", "Translate Chinese to English: {p}"),
    ("Write a news article about", "Summarize: {p}"),
    ("Write a news report on", "Summarize the following article:\n\n{p}"),
    ("Write a short story about", "Summarize this text in a few sentences:\n\n{p}"),
    ("Write an encyclopedia article about", "{p}\n\nAnswer the question using the text above: {q}"),
    ("Describe the history of", "Read the document and answer the question.\n\nDocument: {p}\n\nQuestion: {q}"),
)
PASSAGE_SAMPLING = SamplingConfig(temperature=0.7, top_p=0.9)  # fluent passages, still varied
MAX_TOPIC_TOKENS = 24
MAX_PASSAGE_TOKENS = 320
MIN_PASSAGE_CHARS = 80


def user_turn_prefix(tokenizer) -> str:
    """The chat template's text before a lone user message's content (system prompt included)."""
    marker = "\u2063REQUEST\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                         add_generation_prompt=False)
    return text[:text.index(marker)]


def sample_continuations(model, prompts: list[list[int]], *, max_new_tokens: int, eos_ids,
                         generator: torch.Generator, sampling: SamplingConfig = SAMPLING) -> list[list[int]]:
    """Tokens sampled after each of ``prompts`` until an end-of-sequence id (not kept) or
    ``max_new_tokens``, decoded together (models.packed); the draws are taken step by step in the
    prompts' order, so the same prompts and generator give the same tokens."""
    return decode_packed(model, prompts, max_new_tokens=max_new_tokens, eos_ids=set(eos_ids),
                         choose=lambda i, logits: next_token(logits, sampling, generator))


def _continue_texts(model, tokenizer, texts: list[str], *, max_new_tokens: int, eos_ids, generator,
                    sampling: SamplingConfig = SAMPLING) -> list[tuple[str, bool]]:
    """The target's sampled continuation of each of ``texts`` (decoded), and whether it ran to
    ``max_new_tokens`` rather than ending itself."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    new = sample_continuations(model, ids, max_new_tokens=max_new_tokens, eos_ids=eos_ids, generator=generator,
                               sampling=sampling)
    return [(tokenizer.decode(n, skip_special_tokens=True), len(n) == max_new_tokens) for n in new]


def _chunks(n: int, batch: int) -> Iterator[int]:
    """The sizes of consecutive chunks of at most ``batch`` (>= 1) that make up ``n``."""
    batch = max(1, batch)
    for start in range(0, n, batch):
        yield min(batch, n - start)


def self_requests(model, tokenizer, n: int, *, seed: int = 0, eos_ids=(), batch: int = 1) -> Iterator[str]:
    """Up to ``n`` user requests the target writes itself, reproducible from ``seed`` (and
    ``batch``: how many are written together); a request that runs past MAX_REQUEST_TOKENS is cut
    at its last paragraph break (the model went on to answer it), and one shorter than
    MIN_REQUEST_CHARS is skipped."""
    rng = random.Random(seed)
    generator = make_generator(seed)
    prefix = user_turn_prefix(tokenizer)
    for size in _chunks(n, batch):
        openers = [rng.choice(OPENERS) for _ in range(size)]
        rests = _continue_texts(model, tokenizer, [prefix + o for o in openers], max_new_tokens=MAX_REQUEST_TOKENS,
                                eos_ids=eos_ids, generator=generator)
        for opener, (rest, capped) in zip(openers, rests):
            text = (opener + rest).strip()
            if capped and "\n\n" in text:
                text = text[:text.rindex("\n\n")].strip()
            if len(text) >= MIN_REQUEST_CHARS:
                yield text


def _first_lines(model, tokenizer, texts: list[str], *, max_new_tokens: int, eos_ids, generator) -> list[str]:
    """The target's sampled continuation of each of ``texts``, up to its first line break."""
    got = _continue_texts(model, tokenizer, texts, max_new_tokens=max_new_tokens, eos_ids=eos_ids, generator=generator)
    return [rest.split("\n")[0].strip() for rest, _ in got]


def _answers(model, tokenizer, requests: list[str], *, eos_ids, generator) -> list[str]:
    """The target's sampled answer to each of ``requests`` (one user turn); one that runs past
    MAX_PASSAGE_TOKENS is cut after its last full sentence or paragraph."""
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": r}], tokenize=False,
                                           add_generation_prompt=True) for r in requests]
    answers = []
    for out, capped in _continue_texts(model, tokenizer, texts, max_new_tokens=MAX_PASSAGE_TOKENS, eos_ids=eos_ids,
                                       generator=generator, sampling=PASSAGE_SAMPLING):
        out = out.strip()
        if capped:
            end = max(out.rfind(c) for c in (".", "!", "?", "\u3002", "\n"))
            out = out[:end + 1].strip() if end > 0 else out
        answers.append(out)
    return answers


def passage_requests(model, tokenizer, n: int, *, seed: int = 0, eos_ids=(), batch: int = 1) -> Iterator[str]:
    """Up to ``n`` requests that carry a passage the target wrote itself, reproducible from
    ``seed`` (and ``batch``: how many are written together, stage by stage): the target finishes
    a writing request's opening (PASSAGE_TASKS) with a topic of its own, answers it, and the task's
    request wraps that answer (with a question the target asks about it, where the task has one).
    Passages shorter than MIN_PASSAGE_CHARS are skipped."""
    rng = random.Random(seed)
    generator = make_generator(seed)
    prefix = user_turn_prefix(tokenizer)
    kw = {"eos_ids": eos_ids, "generator": generator}
    for size in _chunks(n, batch):
        tasks = [rng.choice(PASSAGE_TASKS) for _ in range(size)]
        topics = _first_lines(model, tokenizer, [prefix + o for o, _ in tasks], max_new_tokens=MAX_TOPIC_TOKENS, **kw)
        tasks = [(o, w, t) for (o, w), t in zip(tasks, topics) if t]
        passages = _answers(model, tokenizer, [f"{o} {t}".strip() for o, _, t in tasks], **kw)
        kept = [(w, p) for (_, w, _), p in zip(tasks, passages) if len(p) >= MIN_PASSAGE_CHARS]
        asking = [p for w, p in kept if "{q}" in w]
        questions = iter(_first_lines(model, tokenizer, [f"{prefix}{p}\n\nQuestion:" for p in asking],
                                      max_new_tokens=MAX_TOPIC_TOKENS, **kw) if asking else [])
        for wrap, passage in kept:
            question = next(questions) if "{q}" in wrap else ""
            if "{q}" in wrap and not question:
                continue
            yield wrap.format(p=passage, q=question)


def mixed_requests(model, tokenizer, n: int, *, seed: int = 0, eos_ids=(), passage_every: int = 4,
                   batch: int = 1) -> Iterator[str]:
    """Up to ``n`` requests the target writes itself, every ``passage_every``-th one carrying a
    passage (passage_requests), the others self_requests; reproducible from ``seed`` and ``batch``."""
    plain = self_requests(model, tokenizer, n, seed=seed, eos_ids=eos_ids, batch=batch)
    passages = passage_requests(model, tokenizer, n, seed=seed, eos_ids=eos_ids, batch=batch)
    for i in range(n):
        request = next(passages if i % passage_every == passage_every - 1 else plain, None)
        if request is None:
            return
        yield request
