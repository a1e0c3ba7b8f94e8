"""MTP modules (heads/mtp, drafters/mtp) on a tiny random target.

Modules are trained in-process on the tiny target's own greedy text. Module k must be trained
at depth k only (on module k - 1's output), the drafter must read a node of depth d's children
from module d + 1 with the node's own feature and token, and decoding must stay the target's own
greedy output with chains and trees.
"""
from __future__ import annotations

import json

import pytest
import torch

from _tiny import VOCAB, build_hf, drafted, drafting_engine, greedy_runs_equal_plain, load_native, own_texts, save
from specdraft.config import SamplingConfig
from specdraft.drafters import head_kind
from specdraft.drafters.feature_head import output_weight
from specdraft.errors import ModelFileError
from specdraft.heads.data import record
from specdraft.heads.model import load_head
from specdraft.heads.mtp import MTPConfig, MTPModules
from specdraft.heads.train import TrainConfig, _agreement, start_rows, train_head
from specdraft.heads.vocab import as_draft_indices

PROMPTS = [[5, 17, 33, 2, 5, 17, 33, 8], [41, 5, 17, 60, 3], [9, 9, 1, 70, 12, 30]]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_native(save(build_hf("qwen2", seed=0), tmp_path_factory.mktemp("mtp") / "target"))


@pytest.fixture(scope="module")
def trained(target):
    data = record(target, own_texts(target))
    cfg = TrainConfig(inner=128, vocab=VOCAB, steps_unrolled=3, epochs=30, batch=64, negatives=32, lr=3e-3, holdout=0.2)
    modules, report = train_head(data, target.embed, output_weight(target, VOCAB), cfg, log=lambda *a: None, kind="mtp")
    return data, modules, report


def test_every_module_learns_its_own_depth(target, trained):
    data, modules, report = trained
    assert isinstance(modules, MTPModules) and modules.cfg.depth == 3 and len(report["val_agreement"]) == 3
    rows = start_rows(data, torch.arange(len(data.starts) - 1), 3)
    w = output_weight(target, VOCAB)
    got = _agreement(modules, data, target.embed, w, rows, 3, as_draft_indices(data.top, VOCAB))
    base = _agreement(MTPModules(modules.cfg).eval(), data, target.embed, w, rows, 3, as_draft_indices(data.top, VOCAB))
    assert all(g > b + 0.15 for g, b in zip(got, base)), (got, base)
    # each module was trained for its depth: swapping the first two loses depth-one agreement
    swapped = MTPModules(modules.cfg).eval()
    swapped.load_state_dict(modules.state_dict())
    swapped.depths[0], swapped.depths[1] = swapped.depths[1], swapped.depths[0]
    assert _agreement(swapped, data, target.embed, w, rows, 3, as_draft_indices(data.top, VOCAB))[0] < got[0] - 0.05


def test_a_nodes_children_come_from_the_module_of_its_depth(target, trained):
    _, modules, _ = trained
    drafter = drafting_engine(target, "mtp", modules).drafter
    drafter.step = list(modules.depths)  # fp32, to compare with the modules
    f = torch.randn(modules.cfg.hidden_size)
    feats = [torch.randn(modules.cfg.hidden_size) for _ in range(3)]
    drafter.feature = f
    parents = [-1, -1, 0]  # depths 1, 1, 2
    ids = [7, 8, 9, 10]
    got = drafter.advance([2, -1, 0, 1], ids, parents, feats)
    e = target.embed[ids].float()
    inputs = [feats[2], f, feats[0], feats[1]]
    for b, depth in enumerate([2, 0, 1, 1]):
        want = modules.depths[depth](inputs[b][None], e[b:b + 1])[0]
        torch.testing.assert_close(got[b], want)


@pytest.mark.parametrize("trees", [False, True])
def test_greedy_equals_plain_and_guesses_are_accepted(target, trained, trees):
    _, modules, _ = trained
    assert head_kind("mtp") == "mtp"
    runs = greedy_runs_equal_plain(target, "mtp", modules, PROMPTS, trees=trees)
    K = modules.cfg.depth  # a chain has at most K guesses, a tree at most 3 a module
    assert all(s.draft_tokens <= s.drafts * (K if not trees else 3 * K) for s in runs)
    assert sum(s.accepted_tokens for s in runs) > 0


def test_seeded_sampling_is_reproducible_and_drafts(target, trained):
    _, modules, _ = trained
    sampling = SamplingConfig(temperature=0.8, seed=3)
    first, stats = drafted(target, "mtp", PROMPTS[0], modules, sampling)
    again, _ = drafted(target, "mtp", PROMPTS[0], modules, sampling)
    assert first == again and stats.drafts > 0


def test_files_round_trip_and_kinds_are_checked(trained, tmp_path):
    _, modules, _ = trained
    modules.save(tmp_path / "mtp")
    assert json.loads((tmp_path / "mtp" / "head.json").read_text())["kind"] == "mtp"
    back = load_head(tmp_path / "mtp", "mtp")
    for name, value in modules.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], value.to(torch.bfloat16).float())
    with pytest.raises(ModelFileError, match="holds a 'mtp' drafter"):
        load_head(tmp_path / "mtp", "mlp")
    MTPModules(MTPConfig(hidden_size=8, inner=4, depth=2, vocab=VOCAB)).save(tmp_path / "small")
    assert load_head(tmp_path / "small", "mtp").cfg.depth == 2
