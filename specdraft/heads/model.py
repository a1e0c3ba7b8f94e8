"""A drafting head on the target's features: one MLP step from (f_t, x_{t+1}) to f_{t+1}.

f_t [H] is the target's final-norm hidden state at position t (what its output head reads), and
x_{t+1} the token chosen from it. The head predicts the next feature

    f_{t+1} ~= f_t + W2 silu(W1 [rms(f_t) * g_f ; rms(E[x_{t+1}]) * g_e])      W1 [D, 2H], W2 [H, D]

and the target's own output head, cut to the first ``vocab`` ids, turns it into a guess for
x_{t+2}. Fed its own prediction and guess, it drafts further.

With ``taps`` (EAGLE-3's fused features) the first step starts from more than the last layer:

    f_t <- F [rms(a_t^1) * g_1 ; ... ; rms(a_t^k) * g_k ; f_t]                  F [H, (k+1)H]

where a_t^i is the output of the target's layer taps[i] at t (a low and a middle layer, say).
F starts as "take f_t", so training begins at the plain head; later steps feed the head's own
prediction, as before (the target's layers are not known past t). E is the target's embedding
(frozen, not stored with the head). EAGLE's draft is the same idea with a transformer layer in
the middle; this head keeps only the MLP, so one step costs ~2 matrix-vector products of
~3H x D: on a 2-core CPU a few ms, against ~85 ms for a forward of the 1.5B target.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..errors import ModelFileError
from ..models.registry import ALIASES
from .vocab import ListedVocab


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H] divided by its root mean square (RMS norm without a gain)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int  # H: the target's hidden size
    inner: int  # D: the MLP width
    vocab: int  # guesses come from `vocab` token ids: the first ones, or those listed (heads.vocab)
    target: str = ""  # what it was trained on (informative)
    eps: float = 1e-6
    taps: tuple[int, ...] = ()  # target layers whose outputs the first step also reads (EAGLE-3)
    listed_vocab: bool = False  # the ids are the buffer vocab_ids [vocab] (frequency-ranked), not 0..vocab-1

    def __post_init__(self):
        object.__setattr__(self, "taps", tuple(self.taps))  # head.json holds a list


class FusedEntry:
    """For a drafting module whose config has ``hidden_size``, ``taps`` and ``eps``: the fusion F
    of the tapped layers' outputs with the last feature (module docstring), and ``entry``."""

    def init_entry(self) -> None:
        k, H = len(self.cfg.taps), self.cfg.hidden_size
        if k:
            self.g_t = torch.nn.Parameter(torch.ones(k, H))
            self.fuse = torch.nn.Linear((k + 1) * H, H, bias=False)
            with torch.no_grad():  # starts as "take the last layer's feature"
                self.fuse.weight.zero_()
                self.fuse.weight[:, k * H:] = torch.eye(H)

    def entry(self, f: torch.Tensor, aux: torch.Tensor | None, fuse=None) -> torch.Tensor:
        """The first step's feature: f [..., H] itself, or fused with aux [..., k, H] (the tapped
        layers' outputs at the same rows) when the module has taps (``fuse``: a copy of F to use)."""
        if not self.cfg.taps:
            return f
        parts = (rms(aux, self.cfg.eps) * self.g_t).flatten(-2)  # [..., kH]
        return (fuse or self.fuse)(torch.cat([parts, f], -1))


class MLPStep:
    """For a drafting module whose config has ``hidden_size``, ``inner`` and ``eps``: the MLP step
    f + W2 silu(W1 [rms(f) * g_f ; rms(e) * g_e]) (module docstring), starting as "the next
    feature is this one" (W2 at zero)."""

    def init_step(self) -> None:
        H, D = self.cfg.hidden_size, self.cfg.inner
        self.g_f = torch.nn.Parameter(torch.ones(H))
        self.g_e = torch.nn.Parameter(torch.ones(H))
        self.w1 = torch.nn.Linear(2 * H, D)
        self.w2 = torch.nn.Linear(D, H)
        torch.nn.init.zeros_(self.w2.weight)
        torch.nn.init.zeros_(self.w2.bias)

    def step(self, f: torch.Tensor, e: torch.Tensor, w1=None, w2=None) -> torch.Tensor:
        """f, e [..., H] -> the next feature [..., H], with the two matrices given (a drafter may
        run quantized copies of w1, w2; default: the module's own)."""
        eps = self.cfg.eps
        z = torch.cat([rms(f, eps) * self.g_f, rms(e, eps) * self.g_e], -1)  # [..., 2H]
        return f + (w2 or self.w2)(F.silu((w1 or self.w1)(z)))


class FeatureHead(MLPStep, FusedEntry, ListedVocab, torch.nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        self.init_vocab()
        self.init_step()
        self.init_entry()

    def _rms(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x, self.cfg.eps)

    def at_depth(self, s: int) -> FeatureHead:
        """The step of drafting step s: this head at every depth (heads.mtp has one per depth)."""
        return self

    def forward(self, f: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """f [B, H] features, e [B, H] embeddings of the tokens chosen from them -> [B, H]."""
        return self.step(f, e)

    def save(self, directory: str | Path) -> None:
        save_drafter(self, directory)

    @classmethod
    def load(cls, directory: str | Path) -> FeatureHead:
        return read_drafter(cls, HeadConfig, directory, what="drafting head", command="train-head")


def save_drafter(module: torch.nn.Module, directory: str | Path) -> None:
    """A trained drafter's files: head.safetensors (bf16 weights, integer buffers as they are) and
    head.json (its config)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    save_file({k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
               for k, v in module.state_dict().items()}, str(d / "head.safetensors"))
    (d / "head.json").write_text(json.dumps(asdict(module.cfg), indent=1) + "\n")
    (d / "head.safetensors").chmod(0o644)  # safetensors writes 0600; a shipped drafter must be readable


# torch.nn.init's random fills, which a module's construction runs on every weight (the shipped MLP
# head: 0.078 s of its 0.098-s load, Zen 5 EPYC) and load_state_dict then overwrites
_RANDOM_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                 "xavier_normal_")


@contextmanager
def _weights_loaded_after():
    """Modules built inside skip torch.nn.init's random fills: their weights are loaded right
    after, strictly (every parameter and persistent buffer from the file)."""
    saved = {name: getattr(torch.nn.init, name) for name in _RANDOM_INITS}
    for name in _RANDOM_INITS:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, f in saved.items():
            setattr(torch.nn.init, name, f)


def read_drafter(cls, config_cls, directory: str | Path, *, what: str, command: str):
    """``cls(config_cls(**head.json))`` with head.safetensors loaded, in eval mode; a one-line
    ModelFileError naming ``command`` when the files are missing, corrupt or mismatched."""
    d = Path(directory)
    try:
        config = config_cls(**json.loads((d / "head.json").read_text()))
        with _weights_loaded_after():
            module = cls(config)
        module.load_state_dict({k: v.float() if v.is_floating_point() else v
                                for k, v in load_file(str(d / "head.safetensors")).items()})
    except FileNotFoundError:
        raise ModelFileError(f"no {what} in {d} (head.json + head.safetensors); "
                             f"train one with `specdraft {command}` or pass its directory") from None
    except Exception as e:  # user-facing: corrupt or mismatched files
        raise ModelFileError(f"cannot load the {what} in {d} ({type(e).__name__}: {str(e)[:120]}); "
                             f"retrain it with `specdraft {command}`") from None
    return module.eval()


SHIPPED = Path(__file__).parent / "trained"  # heads trained by us, one directory per packaged target


def shipped_head_dir(target: str, kind: str = "mlp") -> str | None:
    """The shipped drafter of a kind ("mlp": the MLP head; "eagle") for a packaged target name
    (or alias), if there is one: trained/<target>/ for the MLP head, trained/<target>/<kind>/ else."""
    name = ALIASES.get(target, target)
    d = SHIPPED / name if kind == "mlp" else SHIPPED / name / kind
    return str(d) if (d / "head.json").is_file() else None


def shipped_frequent_ids(target: str) -> torch.Tensor | None:
    """The listed vocabulary of the MLP head shipped for a packaged target (or alias): the ids the
    target chose most often in the answers it was trained on, ascending; None where no head is
    shipped or its ids are the first ones."""
    d = shipped_head_dir(target)
    if d is None or not json.loads((Path(d) / "head.json").read_text()).get("listed_vocab", False):
        return None
    with safe_open(str(Path(d) / "head.safetensors"), framework="pt") as f:
        return f.get_tensor("vocab_ids").long()


def load_head(directory: str | Path, kind: str = "mlp"):
    """The trained drafter of ``kind`` in ``directory`` (FeatureHead, heads.eagle.EagleHead,
    heads.medusa.MedusaHeads or heads.mtp.MTPModules); a one-line ModelFileError when the directory holds another kind
    or nothing readable."""
    from .eagle import EagleHead
    from .medusa import MedusaHeads
    from .mtp import MTPModules

    try:
        found = json.loads((Path(directory) / "head.json").read_text()).get("kind", "mlp")
    except (OSError, ValueError, AttributeError):
        found = kind  # let the loader say what is missing or corrupt
    if found != kind:
        raise ModelFileError(f"{directory} holds a {found!r} drafter, but this method reads a {kind!r} one; "
                             "pass the matching --head DIR")
    classes = {"eagle": EagleHead, "medusa": MedusaHeads, "hydra": MedusaHeads, "mtp": MTPModules}
    return classes.get(kind, FeatureHead).load(directory)
