"""The bench under sampling (``--temperature`` > 0): per-prompt seeds, which methods may run,
and what the report says where exactness does not apply.

Every prompt's generator is seeded from the run's ``--seed`` and the prompt itself, so a run
repeats token for token and a prompt draws the same numbers whatever order it runs in.
Sampled tokens cannot be compared with ``none``'s: two correct samplers draw different
sequences from the same distribution (that speculative sampling keeps the target's distribution
is what tests/test_statistical.py checks). So exactness is "n/a (sampled)" and there is no
mismatch analysis.

The peers run greedy only. Their samplers do not draw from the distribution ours does:
llama.cpp applies the temperature after top-k/top-p, transformers adds its own top-k of 50 unless
told otherwise and draws from torch's global generator. Timing them beside our methods would not
compare like with like, so a sampled run refuses them.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from ..config import SamplingConfig
from .errors import BenchError
from .methods import is_peer

NOT_APPLICABLE = "n/a (sampled)"  # the exact-match cell of a sampled run


def prompt_seed(seed: int, prompt: list[int] | str) -> int:
    """The seed of one prompt's generator, from the run's seed and the prompt (its token ids, or
    its text at an endpoint). sha256, not hash(): Python salts str hashes per process.

    >>> prompt_seed(1, [3, 4]) == prompt_seed(1, [3, 4]) != prompt_seed(2, [3, 4])
    True
    """
    digest = hashlib.sha256(json.dumps([seed, prompt]).encode()).digest()
    return int.from_bytes(digest[:4], "little") >> 1  # < 2**31: any server's seed field takes it


def for_prompt(sampling: SamplingConfig, prompt_ids: list[int]) -> SamplingConfig:
    """``sampling`` with this prompt's seed; greedy draws nothing, so it stays as it is."""
    return sampling if sampling.greedy else replace(sampling, seed=prompt_seed(sampling.seed, prompt_ids))


def refuse_peers(methods: list[str], sampling: SamplingConfig) -> None:
    """A one-line error when a sampled run names a peer (see the module's docstring for why)."""
    peers = [m for m in methods if is_peer(m)]
    if peers and not sampling.greedy:
        raise BenchError(f"{', '.join(peers)} run greedy only: their samplers differ from ours, so their speed under "
                         "sampling would not compare like with like; drop them or use --temperature 0")


def sampling_report(sampling: SamplingConfig) -> dict:
    """The report's record of how tokens were chosen."""
    return dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p,
                seed=sampling.seed,
                greedy=sampling.greedy,
                prompt_seeds=None if sampling.greedy else "sha256 of [seed, prompt token ids], first 31 bits",
                exact_match=("against none" if sampling.greedy else
                             f"{NOT_APPLICABLE}: sampled tokens differ from none's even when the method is lossless"))


def sampling_note(sampling: SamplingConfig) -> str | None:
    """One line for the tables of a sampled run (None when greedy)."""
    if sampling.greedy:
        return None
    return (f"sampled at temperature {sampling.temperature:g}, top-k {sampling.top_k or 'off'}, "
            f"top-p {sampling.top_p if sampling.top_p < 1 else 'off'}, min-p {sampling.min_p or 'off'}, "
            f"seed {sampling.seed}: exact match is {NOT_APPLICABLE}, "
            "the tokens differ from none's by the draws alone")
