"""Several generations decoded together: one target forward a step for all of them.

A check of a few rows costs little more than one row on these CPUs (2-core Zen 4 EPYC, VNNI
kernels: 4 rows ~1.2x one), so n answers decoded side by side come several times faster than one
after another. Each generation keeps everything of its own: an Engine with its drafter, policy,
sampler (its own generator) and statistics, run as a greenlet of its own (on the caller's thread)
over a :class:`SeqTarget`, a view of one cache shared by all of them. They meet at every forward:
once every live generation has asked for its forward, the caller runs them as one forward over
all their rows, each row seeing only its own sequence's cache slots (a mask over the whole cache)
at its own positions, and hands each generation its rows. So on a target whose layers run natively
(models.llama.packs_exactly: rows that do not depend on their block, a row's visible keys reduced
in ascending slot order, as decoding it alone does) every row gets bit for bit what its
generation alone computes: greedy answers are each prompt's own, sampled ones those of the same
seed alone, log-probabilities included.

The shared cache: a slot belongs to some of the sequences (``owner``, a bit each) or to none.
Generations that prefill the same prompt together (n answers to one prompt) share its slots: one
prefill for all of them, each handed the same rows. A generation's rollback and compaction free
its slots at once (its bit) and the slots nobody holds are squeezed out (models.llama.compact)
before the next forward, so the cache holds what the generations hold and one step's rows.

How much each generation drafts: its policy prices a check with :class:`BatchCosts`, the cost
of the whole step's forward with its rows beside the others' (the others' rows and tokens a step
from their running means), so a guess is sent only where it raises the batch's tokens per second.
A prefill (``last_only``; one for the generations that prefill the same prompt from an empty
cache) runs whole, alone, while nobody else is checking guesses; a prompt that joins generations
already decoding goes on PREFILL_CHUNK rows a step, packed into their checks' forward (only its
last row's logits computed), so they are held up for a chunk at a time, not for its whole length.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import greenlet
import torch

from .costs import ForwardCosts, running_mean
from .models.base import ModelOutput

# cache slots a generation gets beyond its prompt and new tokens: room for its widest check (a
# tree of the policy's size is a few dozen nodes at most)
STEP_ROOM = 128
# generations decoded together at most (more wait for a later group): the step's rows stay where
# the cost curve is flat and the cache small (fp32 K and V of the default 1.5B target: ~57 kB a
# slot, ~250 MB for 8 answers of 256 tokens to 300-token prompts)
MAX_BATCH = 8
MAX_SEQUENCES = 63  # generations a batch holds at once at most: a slot's owners are the bits of an int64
# prompt rows a step takes of a prefill while other generations are checking guesses: the prefill
# goes on in chunks packed into their forwards (each chunk's rows are what one forward of the whole
# prompt computes: rows do not depend on their block), so a long prompt joining holds their steps
# up for a chunk's rows at a time, not for its whole length (a row costs ~6 ms in a check-sized
# block on the 2-core Zen 4 EPYC: 128 rows ~0.8 s a step); a prefill with nobody else checking runs whole
PREFILL_CHUNK = 128


_START = object()  # Batch.run: a generation not yet started


@dataclass
class _Request:
    """One generation's forward, waiting for its rows."""

    ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, its rotary positions
    block: torch.Tensor  # [T, T] bool: which of its own new rows each new row sees
    last_only: bool
    need_hidden: bool
    taps: tuple[int, ...]
    hidden_last_only: bool


@dataclass
class _Prefill:
    """A prompt's prefill going on in chunks: the rows [done:] of ``req`` are still to run; the
    generations ``seqs`` (one, or several prefilling the same prompt from an empty cache) wait
    for it, and get its rows' slots."""

    seqs: list[int]
    req: _Request
    done: int = 0
    hidden: list = field(default_factory=list)  # every row's hidden states (and taps), chunk by chunk, where asked
    taps: list = field(default_factory=list)

    @property
    def length(self) -> int:
        return int(self.req.ids.shape[0])

    @property
    def every_row(self) -> bool:
        """Its caller reads every prompt row's hidden states (EAGLE's layer), not the last one's alone."""
        return self.req.need_hidden and not self.req.hidden_last_only


class BatchCosts(ForwardCosts):
    """One generation's view of the target's forward costs in a batch: a check of t rows beside
    the others' R rows costs the step cost(R + t), where a plain row of its own costs cost(R + 1).

    The policy (policy.DraftPolicy) sends n guesses where (1 + E(n)) / ratio(n + 1) is highest;
    a guess pays in the batch where the tokens it adds, E(n), beat the whole step's tokens K =
    1 + E_others times its extra cost, cost(R + 1 + n) / cost(R + 1) - 1. So this ratio is
    1 + K (cost(R + t) / cost(R + 1) - 1), and drafting time weighs K / cost(R + 1) times what
    it weighs alone (``one_now``): alone (R = 0, K = 1) both are the target's own. It learns
    nothing itself (the batch times its joint forwards into the shared table)."""

    def __init__(self, shared: ForwardCosts):
        super().__init__()
        self.shared = shared
        self.others_rows = 0.0  # the other generations' rows a step (running means)
        self.others_tokens = 0.0  # and the tokens they commit a step

    def set_others(self, rows: float, tokens: float) -> None:
        self.others_rows, self.others_tokens = rows, tokens
        self._ratios.clear()

    @property
    def measured(self) -> bool:
        return self.shared.measured

    @property
    def one_now(self) -> float:
        """What the policy divides drafting seconds by (policy.DraftPolicy.in_forwards): a
        second of this generation's drafting holds up the whole step, so it weighs as the step's
        K tokens over its cost(R + 1): alone, a one-token forward's seconds."""
        return self.shared.one_now * _ratio(self.shared, self.others_rows + 1) / (1.0 + self.others_tokens)

    @one_now.setter
    def one_now(self, value: float) -> None:  # ForwardCosts.__init__ sets it; the shared table holds it
        pass

    def wants_one(self) -> bool:
        return self.shared.wants_one()

    def record(self, tokens: int, seconds: float) -> None:
        pass

    def ratio(self, tokens: int) -> float:
        got = self._ratios.get(tokens)
        if got is None:
            r = self.others_rows
            lo, hi = _ratio(self.shared, r + 1), _ratio(self.shared, r + tokens)
            got = self._ratios[tokens] = 1.0 + (1.0 + self.others_tokens) * (hi / lo - 1.0)
        return got


def _ratio(costs: ForwardCosts, rows: float) -> float:
    """The table's ratio at a fractional row count (linear between whole ones)."""
    lo = int(rows)
    a = costs.ratio(max(lo, 1))
    return a + (costs.ratio(lo + 1) - a) * (rows - lo) if rows > lo else a


class SeqTarget:
    """One generation's target: the CausalLM interface (models.base) over its slots of a
    :class:`Batch`'s cache. ``length`` counts its own positions; ``forward`` waits for the
    batch's joint forward; rollback, compact and reset free its slots."""

    supports_tree = True

    def __init__(self, batch: Batch, seq: int):
        self._batch = batch
        self.seq = seq
        self.slots: list[int] = []  # cache slot of each of its positions, ascending
        self.epoch = 0
        base = batch.model
        self.vocab_size, self.max_length = base.vocab_size, batch.max_length
        self.weight_format, self.dtype = getattr(base, "weight_format", None), getattr(base, "dtype", None)
        self.costs = BatchCosts(batch.costs)
        self.rows_mean = 0.0  # rows a step and tokens committed a step, running means
        self.tokens_mean = 0.0  # (measured from its second check on: step_tokens)
        self._asked_at: int | None = None  # its length at its previous check's forward
        self.reserved = 0  # cache slots set aside for it (Batch.room)

    @property
    def length(self) -> int:
        return len(self.slots)

    @property
    def step_tokens(self) -> float:
        """Tokens it commits a step, as the others' policies count them: its running mean, and
        before its second check (nothing measured yet) the one token any check commits. Counted
        as 0 there, the others' guesses in their first steps were priced as if alone (K = 1, the
        step's other answers committing nothing): sampled answers to one prompt, 8 together, sent
        guesses of chance 0.1-0.15 in their second step (2-core Zen 5 EPYC)."""
        if self.tokens_mean:
            return self.tokens_mean
        return 1.0 if self.rows_mean else 0.0

    def forward(self, ids: torch.Tensor, *, positions: torch.Tensor | None = None,
                tree_mask: torch.Tensor | None = None, last_only: bool = False, need_hidden: bool = False,
                taps: tuple[int, ...] = (), hidden_last_only: bool = False) -> ModelOutput:
        T = int(ids.shape[0])
        if self.length + T > self.max_length:
            raise ValueError(f"cache overflow: {self.length + T} > {self.max_length}")
        if tree_mask is not None and tuple(tree_mask.shape) != (T, T):
            raise ValueError(f"a batched forward takes a [T, T] tree mask over its new rows, got {tuple(tree_mask.shape)}")
        if positions is None:
            positions = torch.arange(self.length, self.length + T, dtype=torch.int64)
        block = tree_mask if tree_mask is not None else torch.ones(T, T, dtype=torch.bool).tril_()
        if not last_only:  # a check: the tokens committed since the previous one, and its rows
            if self._asked_at is not None:
                self.tokens_mean = running_mean(self.tokens_mean, float(self.length - self._asked_at))
            self.rows_mean = running_mean(self.rows_mean, float(T))
            self._asked_at = self.length
        self.epoch += 1
        return self._batch.ask(self, _Request(ids, positions, block, last_only, need_hidden, tuple(taps),
                                              hidden_last_only))

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback to {length} outside [0, {self.length}]")
        self._batch.free(self.seq, self.slots[length:])
        del self.slots[length:]

    def reset(self) -> None:
        self.rollback(0)
        self._asked_at = None
        self.epoch += 1

    def snapshot(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """A copy of its cache rows, per layer K and V [nkv, length, hd] (LlamaModel.snapshot's
        form: prefix.PrefixCache keeps conversations so, and restores them into any cache)."""
        m, index = self._batch.model, torch.tensor(self.slots, dtype=torch.int64)
        return [kc[:, index].clone() for kc in m.k_cache], [vc[:, index].clone() for vc in m.v_cache]

    def restore(self, saved: tuple[list[torch.Tensor], list[torch.Tensor]], length: int | None = None) -> None:
        """Its cache as ``saved`` (a snapshot, its own or the target's; its first ``length`` rows
        where given): the rows written to new slots at the end of the batch's cache (between joint
        forwards, so nobody else writes)."""
        self.rollback(0)
        self.slots = self._batch.append(self.seq, saved, length)
        self.epoch += 1

    def compact(self, start: int, keep: torch.Tensor) -> None:
        """Keep its positions ``keep`` (>= start, ascending) at [start, start + len(keep)): their
        slots stay where they are (ascending, so its keys keep their order)."""
        rows = keep.tolist()
        kept = self.slots[:start] + [self.slots[p] for p in rows]
        self._batch.free(self.seq, sorted(set(self.slots[start:]) - set(kept[start:])))
        self.slots = kept


class Batch:
    """A target's weights over a cache of their own, shared by the generations ``run`` drives
    side by side; ``costs``: the target's forward costs (the joint forwards are timed into it)."""

    def __init__(self, model, capacity: int, costs: ForwardCosts, prefill_chunk: int | None = None):
        self.model = model.with_cache(capacity)
        # prompt rows a step of a prefill beside others' checks (None: PREFILL_CHUNK; 0: whole)
        chunk = PREFILL_CHUNK if prefill_chunk is None else prefill_chunk
        self.prefill_chunk = chunk if chunk > 0 else 1 << 62
        self.max_length = model.max_length  # a sequence's positions: the model's RoPE tables
        self.costs = costs
        self.owner = torch.zeros(self.model.max_length, dtype=torch.int64)  # slot -> its sequences' bits (0: free)
        self.live: dict[int, SeqTarget] = {}  # sequence number -> its generation's target, while it runs
        self._hub = None  # the greenlet that runs the joint forwards (run's caller)
        self.forwards = 0  # joint forwards run, and their rows
        self.rows = 0
        self.prefills = 0  # prefills run (one for the generations that share it), whole or in chunks
        self.chunks = 0  # prefill chunks run beside checks
        self._prefilling: list[_Prefill] = []  # prefills going on in chunks (during run)

    def view(self, reserve: int = 0) -> SeqTarget:
        """A new generation's target: the lowest sequence number no live generation holds, and
        ``reserve`` cache slots set aside for it (``room``) while it lives."""
        seq = next((i for i in range(MAX_SEQUENCES) if i not in self.live), None)
        if seq is None:
            raise ValueError(f"a batch holds at most {MAX_SEQUENCES} generations at once")
        v = self.live[seq] = SeqTarget(self, seq)
        v.reserved = reserve
        return v

    @property
    def room(self) -> int:
        """Cache slots no live generation has reserved."""
        return self.model.max_length - sum(v.reserved for v in self.live.values())

    # ------------------------------------------------------------------ the generations' side
    def ask(self, view: SeqTarget, req: _Request) -> ModelOutput:
        """Wait (on the caller's greenlet) for the joint forward that answers ``req``."""
        result = self._hub.switch(req)
        if isinstance(result, BaseException):  # the joint forward failed: this generation ends with it
            raise RuntimeError("the batch's forward failed") from result
        return result

    def append(self, seq: int, saved: tuple[list[torch.Tensor], list[torch.Tensor]],
               length: int | None = None) -> list[int]:
        """Write a snapshot's rows (its first ``length`` where given) to new slots at the end of the
        cache, held by ``seq``; their slots."""
        self._squeeze()
        ks, vs = saved
        n = int(ks[0].shape[1]) if length is None else min(length, int(ks[0].shape[1]))
        m, L0 = self.model, self.model.length
        if m.max_length < L0 + n:
            raise ValueError(f"the batch's cache is full ({L0} + {n} > {m.max_length} slots)")
        for kc, vc, k, v in zip(m.k_cache, m.v_cache, ks, vs):
            kc[:, L0:L0 + n] = k[:, :n]
            vc[:, L0:L0 + n] = v[:, :n]
        m.length = L0 + n
        self.owner[L0:L0 + n] = 1 << seq
        return list(range(L0, L0 + n))

    def free(self, seq: int, slots: list[int]) -> None:
        """Sequence ``seq`` no longer holds ``slots``."""
        if slots:
            self.owner[torch.tensor(slots, dtype=torch.int64)] &= ~(1 << seq)

    # ------------------------------------------------------------------ the caller's side
    def run(self, jobs: list[Callable[[], None]], views: list[SeqTarget],
            admit: Callable[[], list[tuple[Callable[[], None], SeqTarget]]] | None = None) -> None:
        """Run every ``jobs[i]`` (a generation over ``views[i]``) until all end, running their
        forwards together; ``admit()``, asked before each step, gives more (job, view) pairs to
        start (their prefills run in that step). Re-raises the first error a job raised, once
        all have ended. The jobs run as greenlets on the caller's thread, switching back here at
        each forward: one thread runs everything, as decoding alone does (generations on threads
        of their own each woke a team of OpenMP workers of their own, whose spinning took the
        cores from the joint forward: 2-core Zen 4, one sequence left in a batch, 70 ms a
        forward against 34 alone)."""
        self._hub = greenlet.getcurrent()
        errors: list[BaseException] = []

        def runner(job):
            try:
                job()
            except BaseException as e:  # handed to the caller
                errors.append(e)

        lets: dict[int, greenlet.greenlet] = {}
        replies: dict[int, object] = {}  # what each resumes with (_START: not yet started)

        def start(pairs):
            for job, v in pairs:
                lets[v.seq] = greenlet.greenlet(lambda job=job: runner(job))
                replies[v.seq] = _START

        start(zip(jobs, views))
        self._prefilling = []
        try:
            while replies or self._prefilling or admit is not None:
                if admit is not None:
                    start(admit())
                    if not replies and not self._prefilling:
                        break
                asked: dict[int, _Request] = {}
                for seq, reply in replies.items():  # each runs to its next forward, or to its end
                    g = lets[seq]
                    req = g.switch() if reply is _START else g.switch(reply)
                    if g.dead:  # an ended generation's slots are free (its record is in its engine)
                        self.free(seq, self.live[seq].slots)
                        del self.live[seq], lets[seq]
                    else:
                        asked[seq] = req
                replies = {}
                if not asked and not self._prefilling:
                    continue
                try:
                    replies = self._run_forwards(asked)
                except BaseException as e:  # the waiting generations end with an error of their own
                    replies = dict.fromkeys([*asked, *(q for p in self._prefilling for q in p.seqs)], e)
                    self._prefilling = []
                    errors.append(e)
                    continue
        finally:
            self._prefilling = []
            for g in lets.values():  # (only where the caller itself is interrupted)
                if not g.dead:
                    g.throw(greenlet.GreenletExit)
        self._squeeze()  # every slot is free now
        if errors:
            raise errors[0]

    def _run_forwards(self, asked: dict[int, _Request]) -> dict[int, ModelOutput]:
        """The forwards of this step; what each generation answered gets, by sequence number (a
        generation whose prefill goes on in chunks gets nothing until its last chunk has run).
        A new prefill is one for the generations that prefill the same prompt from an empty
        cache. With checks to run, each prefill's next PREFILL_CHUNK rows go into the forward of
        the checks that read back what it reads (hidden states, tapped layers), else a forward of
        its own; without, each prefill's rows run whole, alone. The checks run together (grouped
        by what they read back), one alone first when the cost table wants a one-token forward to
        anchor its ratios."""
        fresh: dict[tuple, list[int]] = {}
        for s, r in asked.items():
            if r.last_only:
                same = (tuple(r.ids.tolist()), tuple(r.positions.tolist()), r.need_hidden, r.taps, r.hidden_last_only)
                fresh.setdefault(same if self.live[s].length == 0 else (s,), []).append(s)
        self._prefilling += [_Prefill(seqs, asked[seqs[0]]) for seqs in fresh.values()]
        checks = [s for s, r in asked.items() if not r.last_only]
        groups: dict[tuple, list] = {}  # what a forward reads back -> its pieces: check seqs and prefills
        if self.costs.wants_one():
            one = next((s for s in checks if int(asked[s].ids.shape[0]) == 1), None)
            if one is not None:
                checks.remove(one)
                groups[("one",)] = [one]
        for s in checks:
            groups.setdefault((asked[s].need_hidden, asked[s].taps), []).append(s)
        self._others(asked)
        answered: dict[int, ModelOutput] = {}
        for p in self._prefilling:  # (kept listed until the step ends: a failed forward fails their generations too)
            if not groups:  # nobody checks this step: its rows run whole, alone
                self._forward([p], answered, alone=True)
            else:
                groups.setdefault((p.req.need_hidden, p.req.taps), []).append(p)
        for pieces in groups.values():
            self._forward(pieces, answered, asked)
        self._prefilling = [p for p in self._prefilling if p.done < p.length]
        return answered

    def _others(self, asked: dict[int, _Request]) -> None:
        """Tell each generation's costs the others' rows and tokens a step."""
        live = [self.live[s] for s in asked]
        rows = sum(v.rows_mean for v in live)
        tokens = sum(v.step_tokens for v in live)
        for v in live:
            v.costs.set_others(rows - v.rows_mean, tokens - v.step_tokens)

    def _squeeze(self) -> None:
        """Move the live slots down over the freed ones (an order-keeping compaction)."""
        L = self.model.length
        alive = self.owner[:L] != 0
        if bool(alive.all()):
            return
        first = int((~alive).nonzero()[0])
        keep = alive[first:].nonzero().squeeze(1) + first
        self.model.compact(first, keep)
        new = torch.full((L,), -1, dtype=torch.int64)
        new[:first] = torch.arange(first)
        new[keep] = torch.arange(first, first + len(keep))
        self.owner[first:first + len(keep)] = self.owner[keep].clone()
        self.owner[first + len(keep):L] = 0
        for v in self.live.values():
            if v.slots and v.slots[-1] >= first:
                v.slots = new[torch.tensor(v.slots, dtype=torch.int64)].tolist()

    def _forward(self, pieces: list, answered: dict[int, ModelOutput], asked: dict[int, _Request] | None = None,
                 alone: bool = False) -> None:
        """One forward over ``pieces``, in that order: a check (a sequence number: the rows it
        asked for in ``asked``) or a prefill (_Prefill: its next PREFILL_CHUNK rows, or, ``alone``,
        all it has left). Each row sees its sequence's slots and the rows of its own block that its
        mask lets it see; the logits are computed for a check's rows and a finished prefill's last
        row. Fills ``answered`` for the checks and the generations of each finished prefill."""
        self._squeeze()
        m = self.model
        L0 = m.length
        parts = []  # (owners' bits, ids, positions, block, logit rows of the part, the piece)
        for piece in pieces:
            if isinstance(piece, _Prefill):
                r, a = piece.req, piece.done
                n = piece.length - a if alone else min(self.prefill_chunk, piece.length - a)
                self.chunks += not alone
                parts.append((sum(1 << q for q in piece.seqs), r.ids[a:a + n], r.positions[a:a + n],
                              r.block[a:a + n, a:a + n], [n - 1] if a + n == piece.length else [], piece))
            else:
                r = asked[piece]
                T = int(r.ids.shape[0])
                parts.append((1 << piece, r.ids, r.positions, r.block, list(range(T)), piece))
        sizes = [int(ids.shape[0]) for _, ids, *_ in parts]
        R = sum(sizes)
        if m.max_length < L0 + R:
            raise ValueError(f"the batch's cache is full ({L0} + {R} > {m.max_length} slots)")
        mask = torch.zeros(R, L0 + R, dtype=torch.bool)
        rows: list[int] = []  # the rows whose logits are computed
        b = 0
        for (bits, _, _, block, logit_rows, _), T in zip(parts, sizes):
            mask[b:b + T, :L0] = (self.owner[:L0] & bits) != 0
            mask[b:b + T, L0 + b:L0 + b + T] = block
            rows += [b + i for i in logit_rows]
            b += T
        checking = any(not isinstance(p, _Prefill) for p in pieces)
        reqs = [p.req if isinstance(p, _Prefill) else asked[p] for p in pieces]
        first = reqs[0]  # (the pieces of one forward read back the same taps)
        t0 = time.perf_counter()
        if alone:  # a prefill by itself: its last row alone past the last layer's keys and values, where it may
            out = m.forward(parts[0][1], positions=parts[0][2], tree_mask=mask, last_only=True,
                            need_hidden=first.need_hidden, taps=first.taps, hidden_last_only=first.hidden_last_only)
        else:
            out = m.forward(torch.cat([ids for _, ids, *_ in parts]), positions=torch.cat([pos for _, _, pos, *_ in parts]),
                            tree_mask=mask, need_hidden=any(r.need_hidden for r in reqs), taps=first.taps,
                            logit_rows=torch.tensor(rows, dtype=torch.int64))
        seconds = time.perf_counter() - t0
        if checking:
            self.forwards += 1
            self.rows += sum(T for part, T in zip(parts, sizes) if not isinstance(part[-1], _Prefill))
            if not any(isinstance(p, _Prefill) for p in pieces):  # (a forward with a prefill's rows is no check's cost)
                self.costs.record(R, seconds)
        b, at = 0, 0  # the part's first row, and its first row among the logits
        for (bits, _, _, _, logit_rows, piece), T in zip(parts, sizes):
            self.owner[L0 + b:L0 + b + T] = bits
            logits = out.logits[at:at + len(logit_rows)] if not alone else out.logits
            at += len(logit_rows)
            if isinstance(piece, _Prefill):
                self._prefilled(piece, T, range(L0 + b, L0 + b + T), logits, out, slice(b, b + T), alone, answered)
            else:
                r = asked[piece]
                self.live[piece].slots += range(L0 + b, L0 + b + T)
                answered[piece] = ModelOutput(
                    logits, None if out.hidden is None or not r.need_hidden else out.hidden[b:b + T],
                    None if out.taps is None or not r.need_hidden else out.taps[b:b + T])
            b += T

    def _prefilled(self, p: _Prefill, n: int, slots: range, logits: torch.Tensor, out: ModelOutput, part: slice,
                   alone: bool, answered: dict[int, ModelOutput]) -> None:
        """Prefill ``p`` ran its next ``n`` rows into ``slots`` (rows ``part`` of ``out``); once its
        last row has run, each of its generations gets its own copy of the prefill's output (an
        engine may change its rows in place): the last row's logits, and the hidden states (and
        taps) of every row or of the last, as it asked."""
        for q in p.seqs:
            self.live[q].slots += slots
        p.done += n
        if p.req.need_hidden and out.hidden is not None:
            if alone:  # (the forward gave what the request asked: every row's, or the last one's)
                p.hidden.append(out.hidden)
                p.taps.append(out.taps)
            elif p.every_row or p.done == p.length:
                h, t = out.hidden[part], None if out.taps is None else out.taps[part]
                keep = slice(None) if p.every_row else slice(-1, None)
                p.hidden.append(h[keep])
                p.taps.append(None if t is None else t[keep])
        if p.done < p.length:
            return
        self.prefills += 1
        hidden = torch.cat(p.hidden) if p.hidden else None
        taps = torch.cat(p.taps) if p.taps and p.taps[0] is not None else None
        for q in p.seqs:
            answered[q] = ModelOutput(logits.clone(), None if hidden is None else hidden.clone(),
                                      None if taps is None else taps.clone())
