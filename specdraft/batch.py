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
A prefill (``last_only``) runs alone, as it does undecoded (a shared one once for all its askers).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

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
    result: ModelOutput | None = None


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
        self.tokens_mean = 0.0
        self._asked_at: int | None = None  # its length at its previous check's forward
        self.reserved = 0  # cache slots set aside for it (Batch.room)

    @property
    def length(self) -> int:
        return len(self.slots)

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

    def __init__(self, model, capacity: int, costs: ForwardCosts):
        self.model = model.with_cache(capacity)
        self.max_length = model.max_length  # a sequence's positions: the model's RoPE tables
        self.costs = costs
        self.owner = torch.zeros(self.model.max_length, dtype=torch.int64)  # slot -> its sequences' bits (0: free)
        self.live: dict[int, SeqTarget] = {}  # sequence number -> its generation's target, while it runs
        self._hub = None  # the greenlet that runs the joint forwards (run's caller)
        self.forwards = 0  # joint forwards run, and their rows
        self.rows = 0
        self.prefills = 0  # prefill forwards run (one for the generations that share it)

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
        try:
            while replies or admit is not None:
                if admit is not None:
                    start(admit())
                    if not replies:
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
                if not asked:
                    continue
                try:
                    self._run_forwards(asked)
                except BaseException as e:  # the waiting generations end with an error of their own
                    replies = dict.fromkeys(asked, e)
                    errors.append(e)
                    continue
                replies = {seq: req.result for seq, req in asked.items()}
        finally:
            for g in lets.values():  # (only where the caller itself is interrupted)
                if not g.dead:
                    g.throw(greenlet.GreenletExit)
        self._squeeze()  # every slot is free now
        if errors:
            raise errors[0]

    def _run_forwards(self, asked: dict[int, _Request]) -> None:
        """The forwards every live generation asked for: each prefill alone (one for the
        generations that prefill the same prompt from an empty cache), then the checks together
        (grouped by what they read back: hidden states, tapped layers); one check alone first
        when the cost table wants a one-token forward to anchor its ratios."""
        prefills: dict[tuple, list[int]] = {}
        for s, r in asked.items():
            if r.last_only:
                same = (tuple(r.ids.tolist()), tuple(r.positions.tolist()), r.need_hidden, r.taps, r.hidden_last_only)
                prefills.setdefault(same if self.live[s].length == 0 else (s,), []).append(s)
        checks = [s for s, r in asked.items() if not r.last_only]
        groups: dict[tuple, list[int]] = {}
        if self.costs.wants_one():
            one = next((s for s in checks if int(asked[s].ids.shape[0]) == 1), None)
            if one is not None:
                checks.remove(one)
                groups[("one",)] = [one]
        for s in checks:
            groups.setdefault((asked[s].need_hidden, asked[s].taps), []).append(s)
        self._others(asked)
        for seqs in prefills.values():
            self._forward(seqs[:1], asked, sharing=seqs)
        for seqs in groups.values():
            self._forward(seqs, asked)

    def _others(self, asked: dict[int, _Request]) -> None:
        """Tell each generation's costs the others' rows and tokens a step."""
        live = [self.live[s] for s in asked]
        rows = sum(v.rows_mean for v in live)
        tokens = sum(v.tokens_mean for v in live)
        for v in live:
            v.costs.set_others(rows - v.rows_mean, tokens - v.tokens_mean)

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

    def _forward(self, seqs: list[int], asked: dict[int, _Request], sharing: list[int] | None = None) -> None:
        """One forward over the rows ``seqs`` asked for (in that order), each row seeing its
        sequence's slots and its own block's rows its mask lets it see; ``sharing``: the
        sequences that asked for the one prefill ``seqs`` holds, which all get its rows and slots."""
        self._squeeze()
        m = self.model
        L0 = m.length
        reqs = [asked[s] for s in seqs]
        sizes = [int(r.ids.shape[0]) for r in reqs]
        R = sum(sizes)
        if m.max_length < L0 + R:
            raise ValueError(f"the batch's cache is full ({L0} + {R} > {m.max_length} slots)")
        mask = torch.zeros(R, L0 + R, dtype=torch.bool)
        b = 0
        for s, r, T in zip(seqs, reqs, sizes):
            mask[b:b + T, :L0] = (self.owner[:L0] & (1 << s)) != 0
            mask[b:b + T, L0 + b:L0 + b + T] = r.block
            b += T
        first = reqs[0]
        prefill = sharing is not None
        t0 = time.perf_counter()
        out = m.forward(torch.cat([r.ids for r in reqs]), positions=torch.cat([r.positions for r in reqs]),
                        tree_mask=mask, last_only=prefill, need_hidden=any(r.need_hidden for r in reqs),
                        taps=first.taps, hidden_last_only=prefill and first.hidden_last_only)
        seconds = time.perf_counter() - t0
        if not prefill:
            self.costs.record(R, seconds)
            self.forwards += 1
            self.rows += R
        if sharing is not None:
            self.prefills += 1
            self.owner[L0:L0 + R] = sum(1 << s for s in sharing)
            for s in sharing:  # each its own copy: an engine may change its rows in place
                self.live[s].slots += range(L0, L0 + R)
                asked[s].result = ModelOutput(out.logits.clone(), None if out.hidden is None else out.hidden.clone(),
                                              None if out.taps is None else out.taps.clone())
            return
        bits = torch.tensor([1 << s for s in seqs], dtype=torch.int64)
        self.owner[L0:L0 + R] = torch.repeat_interleave(bits, torch.tensor(sizes))
        b = 0
        for s, r, T in zip(seqs, reqs, sizes):
            self.live[s].slots += range(L0 + b, L0 + b + T)
            rows = slice(b, b + T)
            r.result = ModelOutput(out.logits[rows], None if out.hidden is None or not r.need_hidden else out.hidden[rows],
                                   None if out.taps is None or not r.need_hidden else out.taps[rows])
            b += T
