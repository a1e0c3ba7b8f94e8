"""Recording what a drafting head learns from: the target's features and choices on text.

One teacher-forced forward per document (chat template: request, then the answer) gives, for
every position t, the target's final-norm hidden state f_t [H] and its top candidates for the
next token (the argmax first). A head is trained to map (f_t, token_{t+1}) to f_{t+1}: every
quantity comes from the text and one forward, so nothing has to be generated.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from ..models.packed import decode_packed

TOP = 16  # target candidates kept per position (the argmax first)


@dataclass
class FeatureSet:
    features: torch.Tensor  # [N, H] float16, final-norm hidden state of each position
    tokens: torch.Tensor  # [N] int64, the input token at each position
    top: torch.Tensor  # [N, TOP] int64, the target's best next tokens there, best first
    starts: torch.Tensor  # [D + 1] int64, document d covers rows starts[d]:starts[d+1]
    # [N, k, H] float16, the outputs of the target's layers ``taps`` at each position (EAGLE-3
    # style fused features, heads.model), or None when recorded without taps
    aux: torch.Tensor | None = None
    taps: tuple[int, ...] = ()
    # the token ids before each document's first row (an answer's request), concatenated:
    # document d's are context[context_starts[d]:context_starts[d+1]] (none for a text document);
    # None for sets recorded before contexts were kept. With them a set can be recorded again
    # (``record_again``) without generating anything, and its requests are known.
    context: torch.Tensor | None = None  # [M] int64
    context_starts: torch.Tensor | None = None  # [D + 1] int64
    # [D] int64: each document's first rows that are its request (recorded so that a drafter with
    # attention sees the request as it does when drafting, the EAGLE layer; nothing is scored on
    # them), or None: every row is scored (with_requests makes such a set from an answer set)
    request_rows: torch.Tensor | None = None

    def save(self, path) -> None:
        extra = {} if self.aux is None else {"aux": self.aux, "taps": torch.tensor(self.taps)}
        if self.context is not None:
            extra |= {"context": self.context, "context_starts": self.context_starts}
        if self.request_rows is not None:
            extra["request_rows"] = self.request_rows
        torch.save({"features": self.features, "tokens": self.tokens, "top": self.top, "starts": self.starts,
                    **extra}, path)

    @classmethod
    def load(cls, path) -> FeatureSet:
        d = torch.load(path, weights_only=True)
        taps = tuple(d["taps"].tolist()) if "taps" in d else ()
        return cls(d["features"], d["tokens"], d["top"], d["starts"], d.get("aux"), taps,
                   d.get("context"), d.get("context_starts"), d.get("request_rows"))

    def answers_only(self) -> FeatureSet:
        """The set without its documents' request rows (request_rows), their tokens moved to the
        documents' contexts: what drafters scored on every row train on. Itself when it has none."""
        if self.request_rows is None or not int(self.request_rows.sum()):
            return self
        s, e, r = self.starts[:-1].tolist(), self.starts[1:].tolist(), self.request_rows.tolist()
        keep = torch.ones(len(self), dtype=torch.bool)
        contexts = []
        for d, doc in enumerate(self.documents()):
            keep[s[d]:s[d] + r[d]] = False
            contexts.append(doc[:len(doc) - (e[d] - s[d] - r[d])])
        starts = torch.tensor([0] + [b - a - n for a, b, n in zip(s, e, r)]).cumsum(0)
        return FeatureSet(self.features[keep], self.tokens[keep], self.top[keep], starts,
                          None if self.aux is None else self.aux[keep], self.taps, *_joined(contexts))

    def documents(self) -> list[list[int]]:
        """Each document's whole token ids: its context, then its rows' tokens."""
        if self.context is None:
            raise ValueError("this feature set was recorded without its documents' contexts (requests); record it anew")
        c, cs, s = self.context.tolist(), self.context_starts.tolist(), self.starts.tolist()
        t = self.tokens.tolist()
        return [c[cs[d]:cs[d + 1]] + t[s[d]:s[d + 1]] for d in range(len(s) - 1)]

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def encode_document(tokenizer, request: str, answer: str, max_answer_tokens: int) -> list[int]:
    """Chat-template ids of (request, answer), the answer cut to ``max_answer_tokens``."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": request}], tokenize=False,
                                           add_generation_prompt=True)
    head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    body = tokenizer(answer, add_special_tokens=False)["input_ids"][:max_answer_tokens]
    return list(head) + list(body)


def encode_corpus(tokenizer, documents, max_answer_tokens: int = 448):
    """Token id lists of documents (corpus.Document), lazily."""
    for doc in documents:
        yield encode_document(tokenizer, doc.request, doc.answer, max_answer_tokens)


def _top(logits: torch.Tensor) -> torch.Tensor:
    """[..., TOP] the best next-token ids of each row, best first."""
    return logits.topk(min(TOP, logits.shape[-1]), dim=-1).indices


def _collect(documents, *, max_tokens: int | None = None, seconds: float | None = None, progress=None,
             taps: tuple[int, ...] = ()) -> FeatureSet:
    """One FeatureSet from (tokens [n], features [n, H], top [n, TOP], aux [n, k, H] or None)
    per document, produced lazily by ``documents``; stops after ``max_tokens`` rows or
    ``seconds``, whichever first."""
    docs, starts = [], [0]
    t0 = time.perf_counter()
    for doc in documents:
        docs.append(doc)
        starts.append(starts[-1] + len(doc[0]))
        if progress is not None:
            progress(len(doc[0]))
        if (max_tokens is not None and starts[-1] >= max_tokens) or \
                (seconds is not None and time.perf_counter() - t0 >= seconds):
            break
    toks, feats, tops, aux, ctx = zip(*docs, strict=True)
    return FeatureSet(torch.cat(feats), torch.cat(toks), torch.cat(tops), torch.tensor(starts),
                      torch.cat(aux) if taps else None, taps, *_joined(ctx))


def _joined(contexts) -> tuple[torch.Tensor, torch.Tensor]:
    """(context [M], context_starts [D + 1]) from one token id list per document."""
    starts = [0]
    for c in contexts:
        starts.append(starts[-1] + len(c))
    return torch.tensor([t for c in contexts for t in c], dtype=torch.int64), torch.tensor(starts)


def _tapped(out) -> torch.Tensor | None:
    return None if out.taps is None else out.taps.to(torch.float16)


@torch.inference_mode()
def record(model, sequences, *, max_tokens: int | None = None, seconds: float | None = None,
           progress=None, taps: tuple[int, ...] = (), keep_last: list[int] | None = None) -> FeatureSet:
    """Teacher-force ``model`` (a CausalLM) over each token id list; stop after ``max_tokens``
    rows or ``seconds`` of forwards, whichever comes first. ``taps``: also record these layers'
    outputs; ``keep_last``: per sequence, keep only its last n rows (the rest is context, e.g. a
    request before an answer recorded earlier)."""

    def documents():
        for d, ids in enumerate(sequences):
            ids = list(ids)[:model.max_length]
            if len(ids) < 2:
                continue
            model.reset()
            out = model.forward(torch.tensor(ids), need_hidden=True, taps=taps)
            cut = len(ids) - min(keep_last[d], len(ids)) if keep_last else 0  # rows before cut: context
            aux = _tapped(out)
            yield (torch.tensor(ids[cut:]), out.hidden[cut:].to(torch.float16), _top(out.logits[cut:]),
                   None if aux is None else aux[cut:], ids[:cut])

    data = _collect(documents(), max_tokens=max_tokens, seconds=seconds, progress=progress, taps=taps)
    model.reset()
    return data


@torch.inference_mode()
def record_generation(model, prompt: list[int], max_new_tokens: int, eos_ids=(),
                      taps: tuple[int, ...] = ()) -> tuple[list[int], list, list, list]:
    """Plain greedy decoding of ``prompt`` that keeps, for the last prompt position and every
    generated one, the input token, the feature, the top candidates (and the tapped layers'
    outputs): the target's own answer, recorded at no extra cost (each decoding forward
    computes them anyway)."""
    model.reset()
    out = model.forward(torch.tensor(prompt), last_only=True, need_hidden=True, taps=taps)
    toks, feats, tops, aux = [prompt[-1]], [], [], []
    for _ in range(max_new_tokens + 1):
        feats.append(out.hidden[-1].to(torch.float16))
        tops.append(_top(out.logits[-1]))
        if taps:
            aux.append(_tapped(out)[-1])
        nxt = int(tops[-1][0])
        if nxt in eos_ids or len(toks) > max_new_tokens or model.length >= model.max_length:
            break
        toks.append(nxt)
        out = model.forward(torch.tensor([nxt]), need_hidden=True, taps=taps)
    model.reset()
    return toks, feats, tops, aux


def record_answers(model, prompts, *, max_new_tokens: int = 160, eos_ids=(), seconds: float | None = None,
                   progress=None, taps: tuple[int, ...] = (), batch: int = 1) -> FeatureSet:
    """record_generation over encoded prompts until ``seconds`` have passed; ``batch`` > 1:
    that many answers decoded together in one cache (models.packed: the same greedy tokens, and
    rows a fraction of the time), the documents in the prompts' order."""

    def keep(prompt):
        return len(prompt) + 2 <= model.max_length

    def documents():
        if batch <= 1:
            for prompt in filter(keep, prompts):
                yield record_generation(model, prompt, max_new_tokens, eos_ids, taps), prompt
            return
        kept = filter(keep, prompts)
        while chunk := list(itertools.islice(kept, batch)):
            yield from zip(record_generations(model, chunk, max_new_tokens, eos_ids, taps), chunk)

    def rows():
        for (t, f, p, a), prompt in documents():
            if len(t) >= 2:  # the first row is the prompt's last token: the rest is its context
                yield torch.tensor(t[:len(f)]), torch.stack(f), torch.stack(p), torch.stack(a) if a else None, \
                    list(prompt[:-1])

    return _collect(rows(), seconds=seconds, progress=progress, taps=taps)


@torch.inference_mode()
def record_generations(model, prompts: list[list[int]], max_new_tokens: int, eos_ids=(),
                       taps: tuple[int, ...] = ()) -> list[tuple[list[int], list, list, list]]:
    """record_generation of every prompt, decoded together (models.packed.decode_packed)."""
    rec = [([p[-1]], [], [], []) for p in prompts]  # per prompt: tokens, features, tops, taps

    def observe(i, out, r):
        rec[i][1].append(out.hidden[r].to(torch.float16))
        rec[i][2].append(_top(out.logits[r]))
        if taps:
            rec[i][3].append(_tapped(out)[r])

    def choose(i, logits):
        return int(rec[i][2][-1][0])  # the argmax, just observed

    new = decode_packed(model, prompts, max_new_tokens=max_new_tokens, choose=choose, eos_ids=set(eos_ids),
                        observe=observe, need_hidden=True, taps=taps)
    for (toks, *_), n in zip(rec, new):
        toks.extend(n)
    return rec


def record_again(model, data: FeatureSet, *, taps: tuple[int, ...] = (), progress=None) -> FeatureSet:
    """``data``'s documents teacher-forced again (context then rows, its rows kept), e.g. to add
    ``taps``: an answer set needs no generating a second time. ValueError for a set recorded
    without contexts."""
    docs = data.documents()
    keep = (data.starts[1:] - data.starts[:-1]).tolist()
    out = record(model, docs, taps=taps, keep_last=keep, progress=progress)
    out.request_rows = data.request_rows  # the same rows
    return out


def with_requests(model, data: FeatureSet, *, taps: tuple[int, ...] | None = None, progress=None) -> FeatureSet:
    """``data``'s documents teacher-forced again with every row kept, its requests' rows too
    (``request_rows``: the context that each document had): the set an EAGLE layer trains on to
    attend to a request as it does when it drafts. ``taps``: data's own unless given. ValueError
    for a set recorded without contexts."""
    docs = data.documents()
    out = record(model, docs, taps=data.taps if taps is None else taps, progress=progress)
    out.request_rows = data.context_starts[1:] - data.context_starts[:-1]
    if data.request_rows is not None:
        out.request_rows = out.request_rows + data.request_rows
    return out


def concat(sets: list[FeatureSet]) -> FeatureSet:
    """One FeatureSet holding the documents of all of ``sets``."""
    starts, off = [torch.zeros(1, dtype=torch.int64)], 0
    for s in sets:
        starts.append(s.starts[1:] + off)
        off += len(s)
    taps = sets[0].taps if sets and all(s.aux is not None and s.taps == sets[0].taps for s in sets) else ()
    context = context_starts = None
    if all(s.context is not None for s in sets):  # offset like the rows' starts
        context_starts = [torch.zeros(1, dtype=torch.int64)]
        for s in sets:
            context_starts.append(s.context_starts[1:] + context_starts[-1][-1])
        context, context_starts = torch.cat([s.context for s in sets]), torch.cat(context_starts)
    requests = None
    if any(s.request_rows is not None for s in sets):
        requests = torch.cat([torch.zeros(len(s.starts) - 1, dtype=torch.int64) if s.request_rows is None
                              else s.request_rows for s in sets])
    return FeatureSet(torch.cat([s.features for s in sets]), torch.cat([s.tokens for s in sets]),
                      torch.cat([s.top for s in sets]), torch.cat(starts),
                      torch.cat([s.aux for s in sets]) if taps else None, taps, context, context_starts, requests)
