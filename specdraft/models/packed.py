"""Several sequences decoded together in one KV cache (packed batch decoding).

Each forward of a decode step carries one new row per live sequence: B rows cost about what a
B-token verification costs (on a 2-core Zen 4 EPYC, 8 rows ~1.8x one row), so B answers come
~B / 1.8 times faster than one after another. The sequences share the cache's positions: each
owns the cache slots its tokens were written to, and a row attends only to its own sequence's
slots (a mask over the whole cache) at its own positions (RoPE by the sequence's length, not by
the slot). The native attention lists a row's visible keys in ascending slot order and reduces
over that list, so a row gets bit for bit what decoding its sequence alone computes. Prompts are
prefilled one by one, each in one block. The model: a native LlamaModel; the sequences get a
cache of their own (``with_cache``), sized for them.

Used to write and record training data for drafters (heads.requests, heads.data), where many
independent continuations are wanted and none is waited on alone.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

# choose(i, logits [V]) -> the next token of sequence i; observe(i, out, r): row r of forward
# output ``out`` is sequence i's newest row (the prompt's last token first)
Choose = Callable[[int, torch.Tensor], int]
Observe = Callable[[int, object, int], None]


# Most cache positions the sequences decoded together hold (fp32 K and V of every layer: ~57 kB a
# position for the default 1.5B target, so ~470 MB); more sequences wait for a later group
MAX_PACKED = 8192


@torch.inference_mode()
def decode_packed(model, prompts: list[list[int]], *, max_new_tokens: int, choose: Choose, eos_ids=(),
                  observe: Observe | None = None, need_hidden: bool = False,
                  taps: tuple[int, ...] = ()) -> list[list[int]]:
    """The new tokens of every prompt (an end-of-sequence id ends one and is not kept; so does
    reaching ``model.max_length`` tokens), decoding them together in a cache of their own
    (``model.with_cache``): all of them when they fit in MAX_PACKED positions with
    ``max_new_tokens`` each, else in groups that do. A prompt of max_length tokens or more gets [].
    ``model``'s own cache is left as it was. Example, greedy continuations of two prompts:
    ``decode_packed(m, [[1, 2], [3]], max_new_tokens=4, choose=lambda i, logits: int(logits.argmax()))``."""
    out: list[list[int]] = [[] for _ in prompts]
    limit = model.max_length  # a sequence's positions: the model's RoPE tables
    todo = [i for i, p in enumerate(prompts) if 0 < len(p) < limit]
    while todo:
        group, size = [], 0
        for i in todo:  # admit in order while the prompts and their new tokens fit
            need = min(len(prompts[i]) + max_new_tokens, limit)
            if group and size + need > MAX_PACKED:
                break
            group.append(i)
            size += need
        todo = todo[len(group):]
        _decode_group(model.with_cache(size), prompts, group, out, max_new_tokens=max_new_tokens, choose=choose,
                      eos_ids=eos_ids, observe=observe, need_hidden=need_hidden, taps=taps, limit=limit)
    return out


def _decode_group(model, prompts, group, out, *, max_new_tokens, choose, eos_ids, observe, need_hidden, taps, limit):
    """Decode the prompts ``group`` (indices into ``prompts``) together into ``out``, in
    ``model``'s cache (room for them all), each sequence at most ``limit`` tokens long."""
    model.reset()
    owner = torch.full((model.max_length,), -1, dtype=torch.int64)  # cache slot -> sequence index
    length: dict[int, int] = {}  # sequence -> tokens it has in the cache (its next position)
    pending: dict[int, int] = {}  # live sequence -> its next token, not yet fed
    try:
        for i in group:  # prefill one prompt at a time, each seeing its own slots only
            ids, T = prompts[i], len(prompts[i])
            L0 = model.length
            owner[L0:L0 + T] = i
            mask = torch.zeros(T, L0 + T, dtype=torch.bool)  # [T, L0 + T]: causal over its own slots
            mask[:, L0:] = torch.ones(T, T, dtype=torch.bool).tril_()
            res = model.forward(torch.tensor(ids), positions=torch.arange(T), tree_mask=mask, last_only=True,
                                need_hidden=need_hidden, taps=taps)
            length[i] = T
            _next(i, res, -1, out, pending, choose, observe, eos_ids, max_new_tokens,
                  room=model.max_length - model.length, last=len(prompts[i]) >= limit)
        while pending:  # one decode step: a row for each live sequence
            live = list(pending)
            L0, T = model.length, len(live)  # L0 + T fits: _next keeps no more pending than there is room
            seqs = torch.tensor(live)
            owner[L0:L0 + T] = seqs
            mask = owner[None, :L0 + T] == seqs[:, None]  # [T, L0 + T]: its own slots, itself included
            res = model.forward(torch.tensor([pending.pop(i) for i in live]),
                                positions=torch.tensor([length[i] for i in live]), tree_mask=mask,
                                need_hidden=need_hidden, taps=taps)
            for r, i in enumerate(live):
                length[i] += 1
                _next(i, res, r, out, pending, choose, observe, eos_ids, max_new_tokens,
                      room=model.max_length - model.length, last=length[i] >= limit)
    finally:
        model.reset()


def _next(i, res, r, out, pending, choose, observe, eos_ids, max_new_tokens, room, last):
    """Sequence i's newest row is row r of ``res``: observe it, choose the next token and keep it
    pending unless the sequence ends (an end-of-sequence id, max_new_tokens, its ``last``
    position, or the cache's ``room`` taken by the tokens already pending)."""
    if observe is not None:
        observe(i, res, r)
    if len(out[i]) >= max_new_tokens or last or room <= len(pending):
        return
    tok = choose(i, res.logits[r])
    if tok in eos_ids:
        return
    out[i].append(tok)
    pending[i] = tok
