"""Token-tree verification: crafted trees for the greedy walk, and the seeded statistical check
that recursive rejection over a node's children reproduces the target's distribution, for
one-hot children (distinct deterministic guesses) and for children drawn from one q, with a
negative control (a wrong rule must fail the same check)."""
from __future__ import annotations

import pytest
import torch

from specdraft.config import SamplingConfig
from specdraft.sampling import make_generator, probs_from_logits, sample
from specdraft.verify import TreeVerdict, children_of, verify_tree

GREEDY = SamplingConfig()


def rows(*argmaxes: int, V: int = 8) -> torch.Tensor:
    """[len, V] logits whose row i has its argmax at argmaxes[i]."""
    out = torch.zeros(len(argmaxes), V)
    for i, a in enumerate(argmaxes):
        out[i, a] = 5.0
    return out


def test_children_of_checks_parents():
    assert children_of([-1, -1, 0, 2]) == [[0, 1], [2], [], [3], []]
    with pytest.raises(ValueError):
        children_of([0])  # a node cannot be its own parent


def test_greedy_walks_the_matching_branch():
    #        root
    #       /    \
    #   n0=3      n1=5
    #    |        /  \
    #  n2=1    n3=2  n4=4
    draft, parents = [3, 5, 1, 2, 4], [-1, -1, 0, 1, 1]
    g = make_generator(0)
    # target (row j + 1 follows node j): after root 5, after n1 4, after n4 7 -> path n1, n4 (a
    # leaf): bonus 7
    v = verify_tree(rows(5, 0, 4, 0, 0, 7), draft, parents, None, GREEDY, g)
    assert v.path == (1, 4) and v.next_token == 7 and v.bonus and v.tokens(draft) == [5, 4, 7]
    # after root 3, after n0 6 (no child holds 6): path n0, recovered 6
    v = verify_tree(rows(3, 6, 0, 0, 0, 0), draft, parents, None, GREEDY, g)
    assert v.path == (0,) and v.next_token == 6 and not v.bonus
    # nothing matches at the root
    v = verify_tree(rows(7, 0, 0, 0, 0, 0), draft, parents, None, GREEDY, g)
    assert v.path == () and v.next_token == 7 and v.num_accepted == 0


def test_a_chain_tree_is_verified_as_a_chain():
    from specdraft.verify import verify_greedy

    logits = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    best = logits.argmax(-1).tolist()
    draft = best[:2] + [(best[2] + 1) % 8, 0]
    chain = verify_greedy(logits, draft)
    tree = verify_tree(logits, draft, [-1, 0, 1, 2], None, GREEDY, make_generator(0))
    assert tree.tokens(draft) == chain.tokens(draft) and tree.num_accepted == chain.num_accepted == 2


# --------------------------------------------------------------------------- statistics
V = 5
_g = torch.Generator().manual_seed(7)
ROOT, AFTER = 1.3 * torch.randn(V, generator=_g), 1.3 * torch.randn(V, V, generator=_g)  # p(x1), p(x2 | x1)
Q = torch.softmax(1.3 * torch.randn(V, generator=_g), -1)  # the drafter's q at the root
CFG = SamplingConfig(temperature=1.0)


def target_logits(draft: list[int], parents: list[int]) -> torch.Tensor:
    """Row 0: p(x1); row j + 1: p(. | node j's token) for depth-1 nodes, anything below."""
    return torch.stack([ROOT] + [AFTER[draft[j]] if parents[j] == -1 else ROOT for j in range(len(draft))])


def first_two(rule, children: str, runs: int, seed: int) -> torch.Tensor:
    """Counts [V, V] of the first two committed tokens over seeded runs of a depth-1 tree of 3
    children; the second token comes from the target's row below the accepted child (or a plain
    step after a recovered token)."""
    counts = torch.zeros(V, V)
    g = make_generator(seed)
    for _ in range(runs):
        if children == "one-hot":
            draft = [1, 2, 3]  # distinct guesses, no probabilities
            probs = None
        else:
            draft = sample(Q.expand(3, V), g).tolist()  # drawn independently from q
            probs = Q.expand(3, V).clone()
        parents = [-1, -1, -1]
        v = rule(target_logits(draft, parents), draft, parents, probs, CFG, g)
        toks = v.tokens(draft)
        if len(toks) < 2:
            toks.append(int(sample(probs_from_logits(AFTER[toks[0]][None], CFG), g)[0]))
        counts[toks[0], toks[1]] += 1
    return counts


def chi_square_p(counts: torch.Tensor) -> float:
    from scipy.stats import chisquare

    p1 = probs_from_logits(ROOT[None], CFG)[0]
    p2 = probs_from_logits(AFTER, CFG)
    expected = (p1[:, None] * p2).flatten() * counts.sum()
    keep = expected > 0
    return float(chisquare(counts.flatten()[keep].numpy(), expected[keep].numpy()).pvalue)


def wrong_rule(target_logits, draft, parents, probs, cfg, g):
    """The right walk, but a token recovered after rejections is drawn from the target's whole p,
    not from what the rejections left of it (the classic bug): biased towards rejected guesses."""
    v = verify_tree(target_logits, draft, parents, probs, cfg, g)
    if v.path:
        return v
    p = probs_from_logits(target_logits[:1], cfg)
    return TreeVerdict((), int(sample(p, g)[0]), False)


@pytest.mark.parametrize("children", ["one-hot", "sampled"])
def test_tree_sampling_reproduces_the_target(children):
    pytest.importorskip("scipy")
    assert chi_square_p(first_two(verify_tree, children, 6000, seed=1)) > 1e-3


@pytest.mark.parametrize("children", ["one-hot", "sampled"])
def test_the_check_detects_a_wrong_tree_rule(children):
    pytest.importorskip("scipy")
    assert chi_square_p(first_two(wrong_rule, children, 6000, seed=1)) < 1e-6
