"""Requests the target writes itself (Magpie): the chat template up to where a user's message
begins, an opening word or two (or nothing), and the target samples the rest of a user's request.

A chat model's user turns are what it has seen most of in tuning, so its own requests spread over
far more kinds of asks than templates do; drafters trained on its answers to them guess better on
requests they never saw (templated requests teach the templates' style). The openings steer
towards the kinds of a chat workload (writing, roleplay, reasoning, maths, coding, extraction,
science, humanities, translation, summarization, questions); nothing here reads a benchmark's
prompts.
"""
from __future__ import annotations

import random
from collections.abc import Iterator

import torch

from ..config import SamplingConfig
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


def user_turn_prefix(tokenizer) -> str:
    """The chat template's text before a lone user message's content (system prompt included)."""
    marker = "\u2063REQUEST\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                         add_generation_prompt=False)
    return text[:text.index(marker)]


@torch.inference_mode()
def sample_continuation(model, ids: list[int], *, max_new_tokens: int, eos_ids, generator: torch.Generator,
                        sampling: SamplingConfig = SAMPLING) -> list[int]:
    """Tokens sampled after ``ids`` until an end-of-sequence id (not kept) or ``max_new_tokens``."""
    model.reset()
    out = model.forward(torch.tensor(ids), last_only=True)
    new: list[int] = []
    while len(new) < max_new_tokens and model.length < model.max_length:
        tok = next_token(out.logits[-1], sampling, generator)
        if tok in eos_ids:
            break
        new.append(tok)
        out = model.forward(torch.tensor([tok]))
    model.reset()
    return new


def self_requests(model, tokenizer, n: int, *, seed: int = 0, eos_ids=()) -> Iterator[str]:
    """Up to ``n`` user requests the target writes itself, reproducible from ``seed``; a request
    that runs past MAX_REQUEST_TOKENS is cut at its last paragraph break (the model went on to
    answer it), and one shorter than MIN_REQUEST_CHARS is skipped."""
    rng = random.Random(seed)
    generator = make_generator(seed)
    prefix = user_turn_prefix(tokenizer)
    for _ in range(n):
        opener = rng.choice(OPENERS)
        ids = tokenizer(prefix + opener, add_special_tokens=False)["input_ids"]
        new = sample_continuation(model, ids, max_new_tokens=MAX_REQUEST_TOKENS, eos_ids=eos_ids, generator=generator)
        text = (opener + tokenizer.decode(new, skip_special_tokens=True)).strip()
        if len(new) == MAX_REQUEST_TOKENS and "\n\n" in text:
            text = text[:text.rindex("\n\n")].strip()
        if len(text) >= MIN_REQUEST_CHARS:
            yield text
