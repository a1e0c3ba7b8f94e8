"""EAGLE: one decoder layer over the target's features that predicts the next feature.

Where the MLP head (heads.model) sees only the newest feature, EAGLE's layer attends over the
features of the whole context through its own small KV cache. Position p holds the pair

    (f_p, x_{p+1}):   f_p [H] the target's final-norm hidden state at p (it chose x_{p+1})

and the layer maps it to h_p ~= f_{p+1}, from which the target's own output head (its first
``vocab`` rows) reads a guess for x_{p+2}. Drafting further feeds (h_p, guess) at position p+1,
attending to the real pairs up to p and to the draft's own earlier steps: so training unrolls
the same way (training-time test, EAGLE-3 / HASS), see heads.eagle_train.

    x   = fc([f ; rms(E[x]) * g_e])                      fc [H, 2H]  (f is normed by the target)
    x  += o(attn(rope(q), rope(k), v))  over rms(x) * ln1    grouped-query heads, like the target
    x  += down(silu(gate) * up)         over rms(x) * ln2
    h   = rms(x) * g_out                                 (the target's features are normed too)

This is the EAGLE-1 / HASS layer with layernorms (vLLM speculators' "eagle" model with
``layernorms=True``: embedding norm, the decoder layer's input norm, a norm before the output
head), so it exports to that layout exactly (heads.export). Every function takes rows with any
leading dims ([..., H]) and its linear maps as arguments (default: the module's own), so the
drafter can run int8 copies of the same weights.

The second form, ``form="head"`` (EagleMLPHead), is the same attention in front of the MLP
head's step (heads.model) instead of a Llama MLP, with the MLP head's EAGLE-3 fused features
(taps) and frequency-ranked vocabulary:

    z   = [rms(E[x]) * a_e ; rms(f) * a_f]                 the attention reads feature and token
    u   = f + o(attn(rope(q), rope(k), v))  with q, k, v = qkv(z)
    h   = u + W2 silu(W1 [rms(u) * g_f ; rms(E[x]) * g_e])   the MLP head's step on u

o starts at zero, so the layer starts as exactly the MLP head it is built on (``start_from``):
training adds what attending over the context's features is worth, on top of a head that already
guesses well, instead of learning a layer from nothing on the little data one CPU records. That
form has no serving-engine layout (its MLP reads the token too); the "layer" form exports.

The third form, ``form="eagle3"`` (Eagle3Head), is EAGLE-3's layer, as vLLM's speculators
("eagle3") and SGLang (``LlamaForCausalLMEagle3``) load it. Real rows enter as one linear map of
the raw outputs a^1..a^k of the target's tapped layers (a low, a middle and a late one); drafted
rows as the layer's own previous output h, unnormed:

    g   = fc([a^1 ; ... ; a^k])   (real rows)   or   g = h   (drafted rows)     fc [H, kH]
    z   = [rms(E[x]) * ln_e ; rms(g) * ln_h]                                     [2H]
    r   = g + o(attn(rope(q), rope(k), v))  with q, k, v = qkv(z)                 qkv [(nh + 2nkv) hd, 2H]
    h   = r + down(silu(gate) * up)  over rms(r) * ln2                           -> the next step's g
    out = rms(h) * g_out                                                         what the output head reads

Its guesses come from a frequency-ranked draft vocabulary (listed ids, EAGLE-3's d2t / t2d).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .model import FusedEntry, MLPStep, read_drafter, rms, save_drafter
from .vocab import ListedVocab

KIND = "eagle"


@dataclass(frozen=True)
class EagleConfig:
    hidden_size: int  # H: the target's hidden size
    num_heads: int  # query heads of the layer
    num_kv_heads: int  # key/value heads (grouped-query attention)
    head_dim: int
    inner: int  # MLP width
    vocab: int  # guesses come from the target's first `vocab` token ids
    rope_theta: float = 10000.0
    target: str = ""  # what it was trained on (informative)
    eps: float = 1e-6
    kind: str = KIND
    form: str = "layer"  # "layer": EagleHead (EAGLE-1 layer, exports); "head": EagleMLPHead
    taps: tuple[int, ...] = ()  # form "head": target layers fused into real rows' features (heads.model)
    listed_vocab: bool = False  # form "head": the ids are the buffer vocab_ids (heads.vocab)

    def __post_init__(self):
        object.__setattr__(self, "taps", tuple(self.taps))  # head.json holds a list
        if self.form not in FORMS:
            raise ValueError(f"unknown EAGLE form {self.form!r}; the forms are {', '.join(FORMS)}")
        if self.form == "layer" and (self.taps or self.listed_vocab):
            raise ValueError("the 'layer' form reads neither taps nor a listed vocabulary")
        if self.form == "eagle3" and not self.taps:
            raise ValueError("the 'eagle3' form reads the outputs of some target layers: give taps")


FORMS = ("layer", "head", "eagle3")


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., heads, hd] by position tables cos, sin [..., hd] (half-split layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


class _Layer(FusedEntry, ListedVocab, torch.nn.Module):
    """What both forms share: RoPE tables, norms, the linear maps by name, files, the entry of
    real rows (fused with taps) and the vocabulary (the layer form has neither taps nor listed
    ids). Their inputs / project / finish take ``lin``: a dict of the linear maps to use by name
    (LINEARS; default: the module's own), so the drafter can run int8 copies."""

    LINEARS: tuple[str, ...] = ()

    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.cfg = cfg
        self.init_vocab()
        self.init_entry()
        hd = cfg.head_dim
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)  # [hd/2]
        self.register_buffer("inv_freq", inv, persistent=False)

    def _rms(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x, self.cfg.eps)

    def _lin(self, lin: dict | None, name: str):
        return lin[name] if lin else getattr(self, name)

    def rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [..., hd] for integer positions [...]."""
        angles = positions.float().unsqueeze(-1) * self.inv_freq  # [..., hd/2]
        angles = torch.cat([angles, angles], -1)
        return angles.cos(), angles.sin()

    def _heads(self, out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """The qkv projection's output [..., (nh + 2 nkv) hd] -> q [..., nh, hd], k and v
        [..., nkv, hd] (q and k rotated)."""
        c = self.cfg
        q, k, v = out.split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], -1)
        q = q.unflatten(-1, (c.num_heads, c.head_dim))
        k = k.unflatten(-1, (c.num_kv_heads, c.head_dim))
        return rope(q, cos, sin), rope(k, cos, sin), v.unflatten(-1, (c.num_kv_heads, c.head_dim))

    def init_block(self, qkv_in: int, qkv_bias: bool) -> None:
        """The decoder layer's attention projections (q, k, v reading ``qkv_in`` features) and
        MLP, with the post-attention norm ln2 and the output norm g_out; o and down start at zero,
        so the layer starts as its input alone and attention and MLP grow in."""
        c, H = self.cfg, self.cfg.hidden_size
        self.ln2 = torch.nn.Parameter(torch.ones(H))
        self.g_out = torch.nn.Parameter(torch.ones(H))
        self.qkv = torch.nn.Linear(qkv_in, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim, bias=qkv_bias)
        self.o = torch.nn.Linear(c.num_heads * c.head_dim, H, bias=False)
        self.gate_up = torch.nn.Linear(H, 2 * c.inner, bias=False)
        self.down = torch.nn.Linear(c.inner, H, bias=False)
        torch.nn.init.zeros_(self.o.weight)
        torch.nn.init.zeros_(self.down.weight)

    def block(self, x: torch.Tensor, attended: torch.Tensor, lin: dict | None = None) -> torch.Tensor:
        """x [..., H] + the attention's output (attended [..., nh, hd] through o), then + the MLP
        over its norm: the decoder layer's output, unnormed."""
        x = x + self._lin(lin, "o")(attended.flatten(-2))
        gate, up = self._lin(lin, "gate_up")(self._rms(x) * self.ln2).chunk(2, -1)
        return x + self._lin(lin, "down")(F.silu(gate) * up)

    def _pair_heads(self, x: torch.Tensor, g_e: torch.Tensor, g_f: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor, lin: dict | None):
        """The "head" and "eagle3" forms' attention input: x = [f ; e] [..., 2H] (what their
        inputs() gives) -> q, k, v of [rms(e) * g_e ; rms(f) * g_f] (the embedding first)."""
        f, e = x.chunk(2, -1)
        z = torch.cat([self._rms(e) * g_e, self._rms(f) * g_f], -1)  # [..., 2H]
        return self._heads(self._lin(lin, "qkv")(z), cos, sin)

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        """What the output head reads from a step's output h [..., H]: h itself (the "layer" and
        "head" forms end normed; "eagle3" carries h unnormed to its next step)."""
        return h

    def save(self, directory: str | Path) -> None:
        save_drafter(self, directory)

    @classmethod
    def load(cls, directory: str | Path) -> EagleHead | EagleMLPHead | Eagle3Head:
        """The EAGLE drafter in ``directory``, of the form its head.json names."""
        return read_drafter(eagle_module, EagleConfig, directory, what="EAGLE drafter",
                            command="train-drafter --kind eagle")


class EagleHead(_Layer):
    """The "layer" form."""

    LINEARS = ("fc", "qkv", "o", "gate_up", "down")

    def __init__(self, cfg: EagleConfig):
        super().__init__(cfg)
        H = cfg.hidden_size
        self.g_e = torch.nn.Parameter(torch.ones(H))
        self.ln1 = torch.nn.Parameter(torch.ones(H))
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        self.init_block(H, qkv_bias=True)  # starts as fc alone

    def inputs(self, f: torch.Tensor, e: torch.Tensor, lin: dict | None = None) -> torch.Tensor:
        """f, e [..., H] (a feature, the embedding of the token chosen from it) -> x [..., H]."""
        return self._lin(lin, "fc")(torch.cat([f, self._rms(e) * self.g_e], -1))

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lin: dict | None = None):
        """x [..., H] -> q [..., nh, hd], k and v [..., nkv, hd] (q and k rotated)."""
        return self._heads(self._lin(lin, "qkv")(self._rms(x) * self.ln1), cos, sin)

    def finish(self, x: torch.Tensor, attended: torch.Tensor, lin: dict | None = None) -> torch.Tensor:
        """x [..., H] the layer's input, attended [..., nh, hd] -> h [..., H] the predicted feature."""
        return self._rms(self.block(x, attended, lin)) * self.g_out


class EagleMLPHead(MLPStep, _Layer):
    """The "head" form: attention over the context's features in front of the MLP head's step
    (module docstring). x, what inputs() gives and project() / finish() read, is [f ; E[x]]
    [..., 2H]; its parameters keep the MLP head's names (g_f, g_e, w1, w2; g_t, fuse with taps)."""

    LINEARS = ("qkv", "o", "w1", "w2")

    def __init__(self, cfg: EagleConfig):
        super().__init__(cfg)
        H, hd = cfg.hidden_size, cfg.head_dim
        self.a_f = torch.nn.Parameter(torch.ones(H))
        self.a_e = torch.nn.Parameter(torch.ones(H))
        self.qkv = torch.nn.Linear(2 * H, (cfg.num_heads + 2 * cfg.num_kv_heads) * hd)
        self.o = torch.nn.Linear(cfg.num_heads * hd, H, bias=False)
        torch.nn.init.zeros_(self.o.weight)  # starts as the MLP head alone
        self.init_step()

    def inputs(self, f: torch.Tensor, e: torch.Tensor, lin: dict | None = None) -> torch.Tensor:
        return torch.cat([f, e], -1)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lin: dict | None = None):
        return self._pair_heads(x, self.a_e, self.a_f, cos, sin, lin)

    def finish(self, x: torch.Tensor, attended: torch.Tensor, lin: dict | None = None) -> torch.Tensor:
        f, e = x.chunk(2, -1)
        u = f + self._lin(lin, "o")(attended.flatten(-2))
        return self.step(u, e, self._lin(lin, "w1"), self._lin(lin, "w2"))

    def start_from(self, head) -> None:
        """Take an MLP head's step, fusion and vocabulary (heads.model.FeatureHead of the same
        sizes, taps and vocabulary size): with o at zero this layer then guesses as that head."""
        c, h = self.cfg, head.cfg
        if (c.hidden_size, c.inner, c.taps, c.vocab, c.listed_vocab) != \
                (h.hidden_size, h.inner, h.taps, h.vocab, h.listed_vocab):
            raise ValueError(f"the MLP head to start from has hidden {h.hidden_size}, inner {h.inner}, taps "
                             f"{list(h.taps)}, vocab {h.vocab} (listed: {h.listed_vocab}); this layer "
                             f"{c.hidden_size}, {c.inner}, {list(c.taps)}, {c.vocab} (listed: {c.listed_vocab})")
        self.load_state_dict(head.state_dict(), strict=False)


class Eagle3Head(_Layer):
    """The "eagle3" form (module docstring). x, what inputs() gives and project() / finish() read,
    is [g ; E[x]] [..., 2H]. The fusion of the taps is ``fuse`` (fc in the exported layouts), so
    the drafters run it as they run the MLP head's fusion (heads.model.FusedEntry)."""

    LINEARS = ("qkv", "o", "gate_up", "down")

    def __init__(self, cfg: EagleConfig):
        super().__init__(cfg)
        H = cfg.hidden_size
        self.ln_e = torch.nn.Parameter(torch.ones(H))
        self.ln_h = torch.nn.Parameter(torch.ones(H))
        self.init_block(2 * H, qkv_bias=False)  # starts as fc alone

    def init_entry(self) -> None:
        k, H = len(self.cfg.taps), self.cfg.hidden_size
        self.fuse = torch.nn.Linear(k * H, H, bias=False)

    def entry(self, f: torch.Tensor, aux: torch.Tensor | None, fuse=None) -> torch.Tensor:
        """A real row's g: fc over the tapped layers' raw outputs aux [..., k, H] (f, the final
        feature, is not read)."""
        return (fuse or self.fuse)(aux.flatten(-2))

    inputs = EagleMLPHead.inputs  # [g ; E[x]]

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lin: dict | None = None):
        return self._pair_heads(x, self.ln_e, self.ln_h, cos, sin, lin)

    def finish(self, x: torch.Tensor, attended: torch.Tensor, lin: dict | None = None) -> torch.Tensor:
        return self.block(x.chunk(2, -1)[0], attended, lin)

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        return self._rms(h) * self.g_out

    def start_as_last_tap(self, norm: torch.Tensor | None) -> None:
        """Start as "the next feature is this row's last tapped layer, normed as the target norms
        its last": fc takes a^k alone (attention and MLP start at zero) and g_out is the target's
        final-norm weight ``norm`` [H] (kept at ones without it)."""
        k, H = len(self.cfg.taps), self.cfg.hidden_size
        with torch.no_grad():
            self.fuse.weight.zero_()
            self.fuse.weight[:, (k - 1) * H:] = torch.eye(H)
            if norm is not None:
                self.g_out.copy_(norm.float())


def eagle_module(cfg: EagleConfig) -> EagleHead | EagleMLPHead | Eagle3Head:
    """The module of the config's form."""
    return {"head": EagleMLPHead, "eagle3": Eagle3Head}.get(cfg.form, EagleHead)(cfg)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Grouped-query attention of rows q [R, nh, hd] over keys k, v [S, nkv, hd]; mask [R, S]
    (True = may attend) or None (all) -> [R, nh, hd]."""
    R, nh, hd = q.shape
    S, nkv, _ = k.shape
    qg = q.view(R, nkv, nh // nkv, hd)  # query heads grouped by the key head they read
    scores = torch.einsum("rkgd,skd->kgrs", qg, k) * hd ** -0.5  # [nkv, g, R, S]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.einsum("kgrs,skd->rkgd", scores.softmax(-1), v)  # [R, nkv, g, hd]
    return out.reshape(R, nh, hd)
