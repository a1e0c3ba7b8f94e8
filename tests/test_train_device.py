"""Training drafters on a device (heads.device): the CPU always, a CUDA GPU where torch sees one.

Every kind trains on a small synthetic task with a known answer (each document's tokens follow
one rule, the target's choice at a row is a function of its token, a row's feature encodes its
token), so a drafter that trains at all learns it. On each device: one step's loss and gradients
equal the CPU's (the same batch, the same draws), a whole run learns the task and hands back a
drafter on the CPU, and its report names the device.
"""
from __future__ import annotations

import pytest
import torch

from specdraft.errors import ParameterError
from specdraft.heads import eagle_train, medusa, train
from specdraft.heads.data import FeatureSet
from specdraft.heads.device import products_in, training_device
from specdraft.heads.eagle_train import EagleTrainConfig, TargetShape, train_eagle
from specdraft.heads.medusa import MedusaConfig, MedusaHeads, MedusaTrainConfig, train_medusa
from specdraft.heads.model import FeatureHead, HeadConfig
from specdraft.heads.mtp import MTPConfig, MTPModules
from specdraft.heads.train import TrainConfig, train_head
from specdraft.heads.vocab import as_draft_indices

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not CUDA, reason="no CUDA GPU here: the GPU path runs where torch sees one"))]
V, H, TAPS = 48, 32, (0, 1)
SHAPE = TargetShape(num_heads=4, num_kv_heads=2, head_dim=8)


def choice(tokens: torch.Tensor) -> torch.Tensor:
    """The synthetic target's choice at a row, from the row's token."""
    return (tokens * 7 + 3) % V


@pytest.fixture(scope="module")
def task():
    """(data, emb [V, H], w_out [V, H]): 40 documents of 60 rows whose tokens step by +5 (mod V)
    from a random start; features: a fixed random vector per token plus noise; taps: two noisy
    copies of it; top: the choice first, then random runners-up."""
    g = torch.Generator().manual_seed(0)
    docs, n = 40, 60
    start = torch.randint(0, V, (docs, 1), generator=g)
    tokens = ((start + 5 * torch.arange(n)) % V).reshape(-1)  # [N]
    code = torch.randn(V, H, generator=g)
    feats = code[tokens] + 0.1 * torch.randn(len(tokens), H, generator=g)
    aux = torch.stack([feats + 0.1 * torch.randn(len(tokens), H, generator=g) for _ in TAPS], 1)
    top = torch.cat([choice(tokens)[:, None], torch.randint(0, V, (len(tokens), 7), generator=g)], 1)
    data = FeatureSet(feats.half(), tokens, top, torch.arange(0, docs * n + 1, n), aux.half(), TAPS)
    return data, torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.detach().cpu() for k, p in module.named_parameters() if p.grad is not None}


def _same_step(make, loss_on, device: str) -> None:
    """make() -> a fresh module (seeded); loss_on(module, device) -> its loss on one fixed batch
    with that device's tensors: the CPU's and the device's loss and gradients must agree."""
    results = []
    for dev in ("cpu", device):
        torch.manual_seed(0)
        module = make().to(dev)
        loss = loss_on(module, torch.device(dev))
        loss.backward()
        results.append((float(loss.detach()), _grads(module)))
    (a, ga), (b, gb) = results
    assert a == pytest.approx(b, rel=1e-4)
    assert ga.keys() == gb.keys() and ga
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=1e-3, atol=1e-5, msg=k)


def _on(device: torch.device, *tensors):
    return [t.to(device) for t in tensors]


# ------------------------------------------------------------------ device names
def test_device_names_resolve_or_fail_in_one_line():
    assert training_device("cpu") == torch.device("cpu")
    assert training_device("auto").type == ("cuda" if CUDA else "cpu")
    for bad in ("tpu", "gpu0", "mps"):
        with pytest.raises(ParameterError, match="--device"):
            training_device(bad)


@pytest.mark.skipif(CUDA, reason="this machine has a CUDA GPU: asking for one succeeds")
def test_asking_for_a_gpu_without_one_says_so():
    with pytest.raises(ParameterError, match="no CUDA GPU"):
        training_device("cuda")


@pytest.mark.skipif(not CUDA, reason="no CUDA GPU here")
def test_asking_for_a_gpu_index_past_the_last_says_so():
    with pytest.raises(ParameterError, match="CUDA GPU"):
        training_device(f"cuda:{torch.cuda.device_count()}")


# ------------------------------------------------------------------ one step, CPU against the device
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["mlp", "mtp"])
def test_a_head_step_is_the_cpus_on_the_device(task, kind, device):
    data, emb, w = task
    rows = torch.arange(0, 2000, 9)
    top = as_draft_indices(data.top, V)
    negatives = torch.randint(0, V, (16,), generator=torch.Generator().manual_seed(1))

    def make():
        if kind == "mtp":
            return MTPModules(MTPConfig(hidden_size=H, inner=64, depth=3, vocab=V))
        return FeatureHead(HeadConfig(hidden_size=H, inner=64, vocab=V, taps=TAPS))

    def loss_on(module, dev):
        e, wo = _on(dev, emb, w)
        return train._unroll(module, data, e, wo, rows, 3, top, negatives, 0.5, soft=0.5)[0]

    _same_step(make, loss_on, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["layer", "head", "eagle3"])
def test_an_eagle_step_is_the_cpus_on_the_device(task, form, device):
    data, emb, w = task
    cfg = EagleTrainConfig(inner=64, vocab=V, form=form, taps=() if form == "layer" else TAPS, negatives=16)
    batch = eagle_train.stretches(data, torch.arange(6), 30)
    top = as_draft_indices(data.top, V)
    negatives = torch.randint(0, V, (16,), generator=torch.Generator().manual_seed(1))
    config = eagle_train.EagleConfig(hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=8, inner=64, vocab=V,
                                     form=form, taps=cfg.taps)

    def loss_on(module, dev):
        e, wo, neg = _on(dev, emb, w, negatives)
        return eagle_train._loss(module, eagle_train._gather(data, batch, top, bool(cfg.taps), dev), e, wo, cfg, neg)

    _same_step(lambda: eagle_train.eagle_module(config), loss_on, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_a_medusa_step_is_the_cpus_on_the_device(task, kind, device):
    data, emb, w = task
    rows = torch.arange(0, 2000, 7)
    negatives = torch.randint(0, V, (16,), generator=torch.Generator().manual_seed(1))
    cfg = MedusaTrainConfig(num_heads=3, vocab=V, negatives=16)

    def loss_on(module, dev):
        e, wo, neg = _on(dev, emb, w, negatives)
        return medusa._loss(module, data, wo, rows, cfg, neg, e)

    _same_step(lambda: MedusaHeads(MedusaConfig(hidden_size=H, num_heads=3, vocab=V, kind=kind)), loss_on, device)


# ------------------------------------------------------------------ whole runs
def _on_cpu(module: torch.nn.Module) -> bool:
    return all(t.device.type == "cpu" for t in [*module.parameters(), *module.buffers()])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["mlp", "mtp"])
def test_a_head_trains_on_the_device_and_comes_back(task, kind, device):
    data, emb, w = task
    cfg = TrainConfig(inner=64, vocab=V, epochs=10, batch=128, lr=3e-3, negatives=16, holdout=0.2,
                      taps=TAPS if kind == "mlp" else ())
    head, report = train_head(data, emb, w, cfg, kind=kind, log=lambda *a: None, device=device)
    assert _on_cpu(head) and report["device"] == device
    assert min(report["val_agreement"]) > 0.3, report  # chance: 1 / 48


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["layer", "head", "eagle3"])
def test_an_eagle_layer_trains_on_the_device_and_comes_back(task, form, device, tmp_path):
    data, emb, w = task
    cfg = EagleTrainConfig(inner=64, vocab=V, epochs=12, rows=256, chunk=30, negatives=16, lr=3e-3, holdout=0.2,
                           form=form, taps=() if form == "layer" else TAPS, start="random")
    layer, report = train_eagle(data, emb, w, SHAPE, cfg, log=lambda *a: None, init=torch.ones(H), device=device,
                                checkpoint=tmp_path / "checkpoint.pt")
    assert _on_cpu(layer) and report["device"] == device and report["finished"]
    assert min(report["val_agreement"]) > 0.3, report


@pytest.mark.parametrize("device", DEVICES)
def test_a_checkpoint_from_one_device_resumes_on_the_cpu(task, device, tmp_path):
    data, emb, w = task
    cfg = EagleTrainConfig(inner=64, vocab=V, epochs=2, rows=256, chunk=30, negatives=16, holdout=0.2)
    ck = tmp_path / "checkpoint.pt"
    _, first = train_eagle(data, emb, w, SHAPE, cfg, seconds=0.0, checkpoint=ck, log=lambda *a: None, device=device)
    assert not first["finished"] and ck.is_file()
    layer, rest = train_eagle(data, emb, w, SHAPE, cfg, checkpoint=ck, log=lambda *a: None, device="cpu")
    assert rest["finished"] and _on_cpu(layer)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_medusa_heads_train_on_the_device_and_come_back(task, kind, device):
    data, emb, w = task
    cfg = MedusaTrainConfig(num_heads=3, vocab=V, epochs=20, batch=128, lr=1e-2, negatives=16, holdout=0.2)
    heads, report = train_medusa(data, w, cfg, kind=kind, emb=emb, log=lambda *a: None, device=device)
    assert _on_cpu(heads) and report["device"] == device
    assert min(report["val_agreement"]) > 0.3, report


# ------------------------------------------------------------------ bf16 products
def test_unknown_precision_fails_in_one_line():
    with pytest.raises(ParameterError, match="--precision fp16: give one of fp32, bf16"):
        products_in(torch.device("cpu"), "fp16")


def test_bf16_products_learn_and_keep_float32_weights(task):
    """Each trainer with its steps' products in bfloat16: it learns as in float32, its weights stay
    float32, the report says so, and the weights differ from a float32 run's (the products did
    change precision: the option is not a no-op)."""
    data, emb, w = task
    quiet = {"log": lambda *a: None}
    runs = {
        "mlp": lambda p: train_head(data, emb, w, TrainConfig(inner=64, vocab=V, epochs=10, batch=128, lr=3e-3,
                                                              negatives=16, holdout=0.2, taps=TAPS),
                                    kind="mlp", precision=p, **quiet),
        "eagle": lambda p: train_eagle(data, emb, w, SHAPE, EagleTrainConfig(
            inner=64, vocab=V, epochs=12, rows=256, chunk=30, negatives=16, lr=3e-3, holdout=0.2, form="head",
            taps=TAPS, start="random"), init=torch.ones(H), precision=p, **quiet),
        "hydra": lambda p: train_medusa(data, w, MedusaTrainConfig(num_heads=3, vocab=V, epochs=20, batch=128, lr=1e-2,
                                                                   negatives=16, holdout=0.2),
                                        kind="hydra", emb=emb, precision=p, **quiet),
    }
    for name, run in runs.items():
        module, report = run("bf16")
        assert report["precision"] == "bf16" and min(report["val_agreement"]) > 0.3, (name, report)
        assert all(p.dtype == torch.float32 for p in module.parameters()), name
        reference, report32 = run("fp32")
        assert report32["precision"] == "fp32"
        assert any(not torch.equal(a, b) for a, b in zip(module.parameters(), reference.parameters())), name
