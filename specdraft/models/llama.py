"""A compact runtime for the Llama family of decoders (Llama, SmolLM2, Qwen2, Mistral).

One class, :class:`LlamaModel`, loads Hugging Face safetensors weights, keeps a preallocated
KV cache that rolls back by moving a length, and runs a forward over a block of new tokens with
explicit positions and a causal or token-tree attention mask. It returns float32 logits and the
final hidden states (feature-level drafters read them).

Why our own runtime: the speculative loop calls forward with small, varying blocks (1 token to
decode, k+1 to verify) on a cache that must roll back for free; doing that through
transformers' generic cache objects costs Python overhead and copies on every step.

Shapes: T new tokens, H hidden size, nh query heads, nkv key/value heads, hd head dim,
L cache positions in use after the forward.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import ModelFileError
from .base import ModelOutput, check_taps
from .config_view import load_config
from .files import map_safetensor
from .gguf_weights import GGUFLinear, RequantizedWeights
from .hugepages import huge_zeros
from .quant import fbgemm_available, make_linear

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def not_native(config) -> str | None:
    """Why the native runtime cannot compute this model as transformers does, or None."""
    if config.model_type not in SUPPORTED_TYPES:
        return f"model type {config.model_type!r} is not native"
    if getattr(config, "mlp_bias", False):
        return "its MLP has biases, which the native runtime does not add"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"its MLP activation is {config.hidden_act!r}, the native runtime's is silu"
    return None


@dataclass(frozen=True)
class LlamaSpec:
    """The few config fields the forward needs, read from config.json."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    max_position: int
    tie_embeddings: bool
    attention_bias: bool  # Qwen2 has q/k/v biases; Llama may (attention_bias=true)
    qk_norm: bool = False  # Qwen3: each q / k head RMS-normalised (weights [hd]) before RoPE


def read_spec(config) -> LlamaSpec:
    """Build a LlamaSpec from a transformers config object."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    bias = config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False))
    return LlamaSpec(
        model_type=config.model_type,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        head_dim=head_dim,
        rms_eps=config.rms_norm_eps,
        max_position=_attention_span(config),
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        attention_bias=bias,
        qk_norm=config.model_type == "qwen3",
    )


def _attention_span(config) -> int:
    """Positions the native runtime may hold: the model's, or its sliding window where one is in
    force (Mistral 7B v0.1: 4,096; a Qwen with use_sliding_window). Within the window sliding
    attention is full attention, which is what the runtime computes; past it the outputs would
    part from the model's, so a context stops there (a clear overflow, never a wrong token)."""
    window = getattr(config, "sliding_window", None)
    layers = getattr(config, "layer_types", None) or []
    if window and (config.model_type == "mistral" or "sliding_attention" in layers):
        return min(config.max_position_embeddings, int(window))
    return config.max_position_embeddings


def rope_tables(config, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_len, hd] in float32: the default kind computed here as transformers
    computes it, every other kind (llama3, yarn, linear...) by transformers' own initialisers,
    exactly as the reference implementation computes it (they want transformers' config object,
    which config_view keeps for them)."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        scale = 1.0
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        if rope_type not in ROPE_INIT_FUNCTIONS or rope_type == "dynamic":
            raise ModelFileError(f"RoPE type {rope_type!r} is not supported by the native runtime; use --runtime hf")
        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config)
    factors = getattr(config, "rope_freq_factors", None)  # a GGUF's rope_freqs (models.convert)
    if factors is not None:
        inv_freq = inv_freq.float() / torch.tensor(factors, dtype=torch.float)
    pos = torch.arange(max_len, dtype=torch.float)
    freqs = torch.outer(pos, inv_freq.float())  # [max_len, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [max_len, hd]
    return emb.cos() * scale, emb.sin() * scale


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin [.., hd] with its first half negated (see _rotate)."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Apply RoPE (rotate-half convention) to x [heads, T, hd] with cos/sin [T, hd].

    rotate_half(x) * sin == roll(x, hd/2) * sin_signed, where sin_signed has its first half
    negated: the same products bit for bit (a sign flip is exact), in 4 ops instead of 7.
    """
    return x * cos + torch.roll(x, x.shape[-1] // 2, -1) * sin_signed


ATTN_CHUNK = 64  # kv positions are processed in whole chunks of this many (see _attention)
ROW_EXACT_MAX = 64  # fp32 blocks up to this many tokens (drafts, trees) attend row by row


class StepClock:
    """Seconds by step kind, added up over calls: ``x = lap("qkv", product(...))`` charges the time
    since the previous lap (or ``start``) to "qkv" and passes x through."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.t = 0.0

    def start(self) -> None:
        self.t = time.perf_counter()

    def lap(self, name: str, value):
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.t
        self.t = now
        return value

    def clear(self) -> None:
        self.seconds.clear()


# GGUF-weight layers take a longer block (a prefill) this many rows at a time: their rows are
# block-independent, so the same bits, while a layer's intermediates ([rows, 2 x 8960] float32 for
# the default target) stay in cache (measured, 2-core Zen 5, prompts of 700 / 1000 tokens:
# 2.23 -> 1.89 s, 3.52 -> 2.79 s in blocks of 256; 128 to 384 within 3% of it; 200 tokens unchanged)
PREFILL_BLOCK = 256


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int,
               mask: torch.Tensor | None) -> torch.Tensor:
    """Grouped-query attention over the first ``length`` cache positions.

    q [nh, T, hd]; k/v [nkv, Lp, hd] with Lp = ``length`` rounded up to ATTN_CHUNK (positions
    past ``length`` are masked out); mask [T, length] bool or None -> [nh, T, hd].

    Written with plain matmuls over a chunk-rounded kv length rather than with
    scaled_dot_product_attention, on purpose: every row's result is then bitwise independent of
    how many new tokens share the forward (SDPA's CPU kernel splits the query block by its length,
    and a matmul's reduction order depends on its inner size). So a token verified inside a
    block gets exactly the logits it gets when decoded alone, and greedy speculative output
    equals plain greedy output bit for bit, in bf16 too (tests/test_batch_invariance.py).
    """
    nh, T, hd = q.shape
    nkv, Lp, _ = k.shape
    if q.dtype == torch.float32 and T <= ROW_EXACT_MAX:
        return _attention_rows(q, k, v, length, mask)
    g = nh // nkv  # query heads per kv head; head h reads kv head h // g
    scores = torch.matmul(q.reshape(nkv, g * T, hd), k.transpose(1, 2)).float()  # [nkv, g T, Lp]
    scores = scores * (hd ** -0.5)
    allowed = torch.zeros(T, Lp, dtype=torch.bool)
    if mask is None:
        allowed[:, :length] = True
    else:
        allowed[:, :length] = mask
    scores = scores.view(nkv, g, T, Lp).masked_fill_(~allowed, float("-inf")).view(nkv, g * T, Lp)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v).view(nh, T, hd)


def _attention_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int,
                    mask: torch.Tensor | None) -> torch.Tensor:
    """fp32 attention whose every row is bitwise what one-token decoding computes for it.

    fp32 GEMMs (MKL) pick kernels and split reductions by their shapes, including the batch
    count, so a block's rows are not batched: each row runs the very matmul calls a one-token
    forward makes (g query-head rows per kv head, over that row's own chunk-rounded kv length),
    and only the masking and softmax, which are row-wise, run over the whole block. One-token
    fp32 forwards come through here too. Shapes as in _attention.
    """
    nh, T, hd = q.shape
    nkv = k.shape[0]
    g = nh // nkv
    first = length - T  # row i sits at position first + i and sees first + i + 1 positions
    qg = q.view(nkv, g, T, hd)
    out = q.new_empty(nkv, g, T, hd)
    i = 0
    while i < T:
        lp = -(-(first + i + 1) // ATTN_CHUNK) * ATTN_CHUNK
        j = min(T, lp - first)  # rows i..j-1 share kv length lp
        kt, vv = k[:, :lp].transpose(1, 2), v[:, :lp]  # [nkv, hd, lp], [nkv, lp, hd]
        if j - i == 1 and mask is None:  # one causal row (every decode step): the same ops, unbatched
            scores = torch.matmul(qg[:, :, i], kt).float().mul_(hd ** -0.5)  # [nkv, g, lp]
            scores[..., first + i + 1:] = float("-inf")
            out[:, :, i] = torch.matmul(torch.softmax(scores, dim=-1), vv)
            i = j
            continue
        scores = torch.stack([torch.matmul(qg[:, :, r], kt) for r in range(i, j)]).float()  # [n, nkv, g, lp]
        scores = scores * (hd ** -0.5)
        w = min(lp, length)
        allowed = torch.zeros(j - i, lp, dtype=torch.bool)
        if mask is None:  # causal
            allowed[:, :w] = torch.ones(j - i, w, dtype=torch.bool).tril_(first + i)
        else:
            allowed[:, :w] = mask[i:j, :w]
        probs = torch.softmax(scores.masked_fill_(~allowed[:, None, None, :], float("-inf")), dim=-1)
        for r in range(i, j):
            out[:, :, r] = torch.matmul(probs[r - i], vv)  # [nkv, g, hd]
        i = j
    return out.view(nh, T, hd)


class LazyWeights(dict):
    """name -> tensor over safetensors files, read on each access and not kept.

    The model reads each weight once and converts it (fusing, quantizing). Reading everything
    first would double the loading peak, and one open handle would keep the whole memory-mapped
    file resident (measured: 8.1 GB peak RSS for the default w8a8 pair with eager reads). Each
    read opens its own map, released with the tensor. Assigned entries (aliases) stay as in a dict.
    """

    def __init__(self, files):
        from safetensors import safe_open

        super().__init__()
        self._open = safe_open
        self._where: dict[str, str] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118 - safe_open has keys(), no __iter__
                    self._where[name] = str(f)

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name) or name in self._where

    def __getitem__(self, name: str) -> torch.Tensor:
        if dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        if name not in self._where:
            raise KeyError(name)
        try:
            with self._open(self._where[name], framework="pt") as fh:
                return fh.get_tensor(name)
        except Exception as e:
            raise ModelFileError(f"cannot read weight {name!r} ({e}); the file is corrupt, re-create it") from None

    def get(self, name: str, default=None):
        return self[name] if name in self else default  # noqa: SIM401 - this is the get() that rule suggests

    def mapped(self, name: str) -> torch.Tensor | None:
        """The stored tensor ``name`` mapped on its own, copy-on-write (files.map_safetensor), or
        None (an alias, or a dtype it does not map)."""
        if dict.__contains__(self, name) or name not in self._where:
            return None
        try:
            return map_safetensor(Path(self._where[name]), name)
        except (OSError, ValueError):
            return None

    def pop(self, name: str, default=None):
        self._where.pop(name, None)
        return dict.pop(self, name, default)


class _Layer:
    """One decoder layer: norms and linear objects, with q/k/v and gate/up fused."""

    __slots__ = ("down", "gate_up", "ln1", "ln2", "o", "qk_norm", "qkv")

    def __init__(self, ln1, ln2, qkv, o, gate_up, down, qk_norm=None):
        self.ln1, self.ln2 = ln1, ln2  # [H]
        self.qkv, self.o = qkv, o  # H -> (nh + 2 nkv) hd, nh hd -> H
        self.gate_up, self.down = gate_up, down  # H -> 2I, I -> H
        self.qk_norm = qk_norm  # (q_norm, k_norm) [hd] each (Qwen3), else None


class LlamaModel:
    """Llama-family decoder with a static KV cache. See the module docstring."""

    supports_tree = True
    fused = True  # GGUF-weight layers: blocks of <= ROW_EXACT_MAX tokens in one native call (kernels.Decoder)

    # `weights` is consumed: unfused tensors are dropped as layers are built, to bound peak memory.
    def __init__(self, spec: LlamaSpec, weights: dict[str, torch.Tensor], config, *, dtype=torch.bfloat16,
                 max_length: int = 4096, weight_format: str = "dense",
                 head_vocab: int | torch.Tensor | None = None, quantized=None):
        self.spec = spec
        self.dtype = dtype
        self.vocab_size = spec.vocab_size
        self.vocab_ids = None  # [V'] ascending: the ids a listed output head scores (logit j is id vocab_ids[j])
        if isinstance(head_vocab, torch.Tensor):
            ids = head_vocab.long()
            if ids.dim() != 1 or len(ids) == 0 or not bool((ids.diff() > 0).all()) or int(ids[0]) < 0 \
                    or int(ids[-1]) >= spec.vocab_size:
                raise ValueError(f"a listed head vocabulary holds distinct ascending ids below {spec.vocab_size}")
            self.vocab_ids = ids
        self.max_length = min(max_length, spec.max_position)
        self.length = 0
        self.epoch = 0  # reset / forward / restore calls: a PrefixCache's record holds only while this is unchanged
        s = spec

        tied = s.tie_embeddings or "lm_head.weight" not in weights

        def raw(name: str) -> torch.Tensor:
            """A linear layer's weight as stored: make_linear converts it to the compute dtype."""
            if name == "lm_head.weight" and tied:
                name = "model.embed_tokens.weight"
            if name not in weights:
                raise ModelFileError(f"weight {name!r} is missing from the model files; the checkpoint is incomplete")
            return weights[name]

        def w(name: str) -> torch.Tensor:
            return raw(name).to(dtype).contiguous()

        # weight format "gguf": projections keep the GGUF file's own quantization (``quantized``:
        # a gguf_weights.GGUFTensors); a layer with a tensor type the kernels lack uses w8a8.
        # "q4k": the same kernels over the float weights quantized on load (RequantizedWeights).
        fallback = ("w8a8" if fbgemm_available() else "dense") if weight_format in ("gguf", "q4k") else weight_format

        def linear(names: list[str], bias: torch.Tensor | None, role: str, rows: int | torch.Tensor | None = None):
            """One projection over the weights ``names`` stacked along the outputs (``rows``: an
            output head's first rows only, or the rows of the ids listed)."""
            if quantized is not None:
                parts = [quantized.get(n, rows) for n in names]
                if all(p is not None for p in parts):
                    return GGUFLinear(parts, bias)
            m = raw(names[0]) if len(names) == 1 else torch.cat([raw(n) for n in names])
            if isinstance(rows, torch.Tensor):
                m = m[rows].contiguous()
            elif rows is not None:
                m = m[:rows].contiguous()
            return make_linear(m, bias, fallback, role, dtype)

        self.weight_format = weight_format
        if "model.embed_tokens.weight" not in weights and s.tie_embeddings and "lm_head.weight" in weights:
            weights["model.embed_tokens.weight"] = weights["lm_head.weight"]  # tied, saved under the head's name
        # The embedding is only gathered from: keep it in its stored dtype when that is bf16 (an
        # exact fp32 lookup at half the memory), else in the compute dtype.
        emb = weights.get("model.embed_tokens.weight")
        # Stored in bf16, it is mapped on its own (LazyWeights.mapped: only the rows a generation
        # gathers are read, none copied at load); else a copy: a tensor read from safetensors maps
        # the whole file, and a copy lets that map go (measured: the 2.9 GB file stayed resident
        # behind a 0.45 GB embedding).
        bf16_copy = emb is not None and emb.dtype == torch.bfloat16
        mapped = weights.mapped("model.embed_tokens.weight") if bf16_copy and isinstance(weights, LazyWeights) else None
        if mapped is None:
            mapped = emb.clone() if bf16_copy else w("model.embed_tokens.weight").clone()
        self.embed = mapped  # [V, H]
        # Draft models only: logits for some ids alone: the first head_vocab ids (BPE vocabularies
        # put frequent tokens first), or the ids head_vocab lists (ascending: the target's frequent
        # choices; logit j is then id vocab_ids[j]). The output head is the largest matrix of a
        # small model; a draft that cannot propose a rare token loses only that guess, never exactness.
        if self.vocab_ids is not None:
            rows = self.vocab_ids
        else:
            rows = head_vocab if head_vocab is not None and head_vocab < spec.vocab_size else None
        self.lm_head = linear(["lm_head.weight"], None, "head", rows)  # H -> V' (V' = head_vocab, listed ids or V)
        self.norm = w("model.norm.weight")
        self.layers: list[_Layer] = []
        for i in range(s.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            b_qkv = None
            if s.attention_bias and (a + "q_proj.bias") in weights:
                b_qkv = torch.cat([w(a + "q_proj.bias"), w(a + "k_proj.bias"), w(a + "v_proj.bias")]).contiguous()
            lin = [linear([a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"], b_qkv, "qkv"),
                   linear([a + "o_proj.weight"], None, "o"),
                   linear([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], None, "gate_up"),
                   linear([p + "mlp.down_proj.weight"], None, "down")]
            qk_norm = (w(a + "q_norm.weight"), w(a + "k_norm.weight")) if s.qk_norm else None
            self.layers.append(_Layer(w(p + "input_layernorm.weight"), w(p + "post_attention_layernorm.weight"), *lin,
                                      qk_norm=qk_norm))
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):  # free the unfused copies as we go
                weights.pop(a + name + ".weight", None)
            for name in ("gate_proj", "up_proj", "down_proj"):
                weights.pop(p + "mlp." + name + ".weight", None)
        cos, sin = rope_tables(config, self.max_length)  # [max_len, hd] float32
        self.cos, self.sin = cos.to(dtype), signed_sin(sin).to(dtype)  # sin with its first half negated
        # Capacity rounded up to whole attention chunks, so the chunk-rounded kv length always fits.
        shape = (s.num_kv_heads, -(-self.max_length // ATTN_CHUNK) * ATTN_CHUNK, s.head_dim)
        # in 2 MB pages where the kernel gives them (models.hugepages): a decode step's attention
        # reads every cached row from memory, 25% faster than through 4 KB pages (AMX Xeon)
        self.k_cache = huge_zeros(shape, dtype, s.num_layers)
        self.v_cache = huge_zeros(shape, dtype, s.num_layers)
        self._q_size = s.num_heads * s.head_dim
        self._kv_size = s.num_kv_heads * s.head_dim
        # With every projection on GGUF weights (fp32) the layers run natively: attention
        # (kernels/attention.cpp, rows block-independent by construction) and fused steps between
        # the products (kernels/layer_ops.cpp) instead of ~35 small torch calls each.
        self._ops = self._decoder = None
        self._loop_steps = StepClock()  # the layer loop's seconds by step kind (step_seconds)
        if (quantized is not None and dtype == torch.float32 and s.head_dim % 16 == 0 and
                all(isinstance(lin, GGUFLinear) for layer in self.layers
                    for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))):
            self._ops = self.layers[0].qkv.ops
            self._decoder = self._build_decoder()

    def _build_decoder(self):
        """Every layer in one native call for blocks the native attention takes (decode steps,
        drafts, trees): the same kernels in the same order as _native_layers' loop, without its ~18
        Python-side calls a layer; a tapped forward copies the tapped layers' outputs out in the
        same call (forward_tapped: one call where a decoder a part between taps cost 0.2-0.4 ms
        more a forward of 1-4 rows, Zen 5 EPYC)."""
        return self._ops.Decoder(
            [(l.ln1, l.ln2, kc, vc, l.qkv.native_spec(), l.o.native_spec(), l.gate_up.native_spec(),
              l.down.native_spec(), *(l.qk_norm or ()))
             for l, kc, vc in zip(self.layers, self.k_cache, self.v_cache)],
            self.spec.num_heads, self.spec.rms_eps)

    def with_layers(self, keep: list[int], *, share_cache: bool = False) -> LlamaModel:
        """This model running only the decoder layers ``keep`` (ascending), the others skipped:
        the same weight tensors (nothing copied), with a KV cache of its own or (``share_cache``)
        this model's cache rows of the kept layers, whose length the caller sets. A compressed
        copy of the target that drafts for it (self-speculation, drafters.self_draft)."""
        if not keep or sorted(set(keep)) != list(keep) or not 0 <= keep[0] <= keep[-1] < len(self.layers):
            raise ValueError(f"layers to keep must be ascending indices into {len(self.layers)} layers, got {keep}")
        own = (lambda c: c) if share_cache else torch.zeros_like
        return self._view([self.layers[i] for i in keep], [own(self.k_cache[i]) for i in keep],
                          [own(self.v_cache[i]) for i in keep], self.max_length)

    def with_cache(self, capacity: int) -> LlamaModel:
        """This model with a KV cache of its own for ``capacity`` positions (the same weights,
        nothing copied): room for several sequences decoded together in one cache (models.packed),
        each at most this model's max_length long (its RoPE tables)."""
        shape = (self.spec.num_kv_heads, -(-capacity // ATTN_CHUNK) * ATTN_CHUNK, self.spec.head_dim)
        return self._view(self.layers, [torch.zeros(shape, dtype=self.dtype) for _ in self.layers],
                          [torch.zeros(shape, dtype=self.dtype) for _ in self.layers], capacity)

    def grow_cache(self, capacity: int) -> None:
        """Room for ``capacity`` positions in this model's own cache (a view's, from with_cache),
        its rows kept: new caches, the held rows copied, the native decoder rebuilt over them. At
        most the RoPE tables' length; nothing happens where the cache holds ``capacity`` already."""
        if capacity <= self.max_length:
            return
        if capacity > self.cos.shape[0]:
            raise ValueError(f"a cache of {capacity} positions is longer than this model's RoPE tables ({self.cos.shape[0]})")
        L = self.length
        shape = (self.spec.num_kv_heads, -(-capacity // ATTN_CHUNK) * ATTN_CHUNK, self.spec.head_dim)
        grown = [], []
        for old, new in zip((self.k_cache, self.v_cache), grown):
            for c in old:
                new.append(torch.zeros(shape, dtype=c.dtype))
                new[-1][:, :L] = c[:, :L]
        self.k_cache, self.v_cache = grown
        self.max_length = capacity
        if self._decoder is not None:
            self._decoder = self._build_decoder()
        self.epoch += 1

    def _view(self, layers: list, k_cache: list, v_cache: list, max_length: int) -> LlamaModel:
        """A shallow copy of this model (the same weight tensors) running ``layers`` over these
        caches of ``max_length`` positions, empty, with its native decoder built over them."""
        view = copy.copy(self)
        view.layers, view.k_cache, view.v_cache, view.max_length = layers, k_cache, v_cache, max_length
        view.length = 0
        if self._decoder is not None:
            view._decoder = view._build_decoder()
        return view

    # ----------------------------------------------------------------------------- loading
    @classmethod
    def from_dir(cls, path: str | Path, *, dtype=torch.bfloat16, max_length: int = 4096,
                 weight_format: str = "dense", head_vocab: int | torch.Tensor | None = None,
                 gguf=None, config=None) -> LlamaModel:
        """weight_format "gguf" needs ``gguf``: the gguf_weights.GGUFTensors of the file the
        directory was converted from. ``config``: the directory's (config_view.load_config), where
        the caller has read it already."""
        path = Path(path)
        try:
            config = config if config is not None else load_config(path)
        except Exception as e:
            raise ModelFileError(f"cannot read {path}/config.json ({type(e).__name__}); is this a model directory?") from None
        if (why := not_native(config)) is not None:
            raise ModelFileError(f"{why}; use --runtime hf")
        if weight_format == "gguf" and gguf is None:
            raise ModelFileError(f"weight format gguf needs the GGUF file behind {path}: "
                                 "give a packaged model name or a .gguf file, or use another format")
        # gguf: the matrices are the GGUF's records, the rest its own numbers (GGUFTensors.dense_file,
        # listed last: its names win), whatever copy ``path`` holds (perhaps a config and tokenizer
        # alone: packaged.resolve_model_dir)
        files = sorted(path.glob("*.safetensors")) + ([gguf.dense_file()] if weight_format == "gguf" else [])
        if not files:
            raise ModelFileError(f"no *.safetensors weights in {path}; convert or re-download the model")
        try:
            weights = LazyWeights(files)
        except Exception as e:
            raise ModelFileError(f"cannot read weights in {path} ({e}); the file is corrupt, re-create it") from None
        if weight_format == "q4k":
            gguf = RequantizedWeights(weights)
        return cls(read_spec(config), weights, config, dtype=dtype, max_length=max_length,
                   weight_format=weight_format, head_vocab=head_vocab,
                   quantized=gguf if weight_format in ("gguf", "q4k") else None)

    def step_seconds(self) -> dict[str, float] | None:
        """Seconds the native layers spent in each kind of step (rms_quantize, qkv, rope_cache,
        attention, o, gate_up, swiglu_quantize, down), summed over layers and forwards since
        clear_step_seconds: the fused decoder's blocks and the layer loop's (longer blocks: a
        prefill); forwards of the fused decoder with taps run other decoders and are not counted.
        None where the layers do not run natively."""
        if self._decoder is None:
            return None
        fused = dict(zip(self._decoder.step_names, self._decoder.step_seconds(), strict=True))
        return {name: t + self._loop_steps.seconds.get(name, 0.0) for name, t in fused.items()}

    def clear_step_seconds(self) -> None:
        if self._decoder is not None:
            self._decoder.clear_step_seconds()
        self._loop_steps.clear()

    @property
    def packs_exactly(self) -> bool:
        """Whether the rows of sequences packed in one cache (a mask over the whole cache:
        models.packed, specdraft.batch) get bit for bit what each sequence alone computes: the
        native layers, whose rows do not depend on their block and whose attention reduces over a
        row's visible keys in slot order (torch's attention over a masked cache differs by rounding)."""
        return self._ops is not None

    # ----------------------------------------------------------------------------- cache
    def rollback(self, length: int) -> None:
        """Forget cache positions >= length. O(1): later writes overwrite the stale entries."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback to {length} outside [0, {self.length}]")
        self.length = length

    def reset(self) -> None:
        self.length = 0
        self.epoch += 1  # whoever changes the cache voids what a PrefixCache recorded

    def snapshot(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """A copy of the cache's rows [0, length): per layer K and V [nkv, length, hd] (restore() puts
        them back, the same bits; prefix.PrefixCache keeps earlier conversations this way)."""
        L = self.length
        return [kc[:, :L].clone() for kc in self.k_cache], [vc[:, :L].clone() for vc in self.v_cache]

    def restore(self, saved: tuple[list[torch.Tensor], list[torch.Tensor]], length: int | None = None) -> None:
        """The cache as snapshot() saw it: its rows written back, ``length`` their count (the first
        ``length`` of them where given: the part of a saved prefix a prompt keeps)."""
        ks, vs = saved
        L = int(ks[0].shape[1]) if length is None else min(length, int(ks[0].shape[1]))
        if self.max_length < L or len(ks) != len(self.k_cache):
            raise ValueError(f"a snapshot of {len(ks)} layers x {L} positions does not fit this cache")
        for kc, vc, k, v in zip(self.k_cache, self.v_cache, ks, vs):
            kc[:, :L] = k[:, :L]
            vc[:, :L] = v[:, :L]
        self.length = L
        self.epoch += 1

    def compact(self, start: int, keep: torch.Tensor) -> None:
        """Keep cache rows ``keep`` (absolute positions >= start, ascending) at [start, start+len(keep)).

        Used after tree verification: the accepted path's KV moves next to the prefix, and the
        rest of the tree is forgotten. keep: [n] int64. Rows already in place are not copied: most
        accepted paths start with the tree's first nodes (measured on an AMX Xeon, the head's trees
        over 128 tokens: ~20 rows moved in ~40 calls, each call 0.6 ms for its two index ops a layer).
        """
        rows = keep.tolist()
        n = len(rows)
        j = next((i for i, r in enumerate(rows) if r != start + i), n)  # rows [0, j) are in place
        if j < n:
            moved = keep[j:]
            for kc, vc in zip(self.k_cache, self.v_cache):
                kc[:, start + j:start + n] = kc[:, moved]
                vc[:, start + j:start + n] = vc[:, moved]
        self.length = start + n

    # ----------------------------------------------------------------------------- forward
    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # Same order of operations as transformers' RMSNorm: normalise in float32, scale in dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True).add_(self.spec.rms_eps))
        return weight * (xf if self.dtype == torch.float32 else xf.to(self.dtype))

    @staticmethod
    def _mask(T: int, L0: int, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Attention mask over [prefix | new block]: None when T == 1 and no tree (the one row sees
        everything before it); otherwise [T, L0 + T] bool, True = may attend. ``tree_mask``: [T, T]
        over the new block (the prefix seen whole), or already [T, L0 + T] over the whole cache
        (several sequences packed in one cache, models.packed)."""
        if T == 1 and tree_mask is None:
            return None
        if tree_mask is not None and tree_mask.shape[1] == L0 + T:
            return tree_mask.contiguous()
        block = tree_mask if tree_mask is not None else torch.ones(T, T, dtype=torch.bool).tril_()
        return torch.cat([torch.ones(T, L0, dtype=torch.bool), block], dim=1)

    def _torch_layers(self, x: torch.Tensor, L0: int, cos: torch.Tensor, sin: torch.Tensor,
                      tree_mask: torch.Tensor | None, tapped: dict[int, torch.Tensor]) -> torch.Tensor:
        """The decoder layers with torch ops (any dtype and weight format): x [T, H] -> [T, H]
        (``tapped``: layer index -> its output, filled in for the layers it holds)."""
        s = self.spec
        T = x.shape[0]
        L = L0 + T
        Lp = -(-L // ATTN_CHUNK) * ATTN_CHUNK  # kv length rounded up to a whole chunk
        mask = self._mask(T, L0, tree_mask)
        for i, layer in enumerate(self.layers):
            h = self._rms(x, layer.ln1)
            qkv = layer.qkv(h)  # [T, (nh + 2 nkv) hd]
            qk = qkv[:, :self._q_size + self._kv_size].view(T, s.num_heads + s.num_kv_heads, s.head_dim)
            if layer.qk_norm is not None:  # Qwen3: each head normalised over its hd values
                qk = torch.cat([self._rms(qk[:, :s.num_heads], layer.qk_norm[0]),
                                self._rms(qk[:, s.num_heads:], layer.qk_norm[1])], 1)
            qk = _rotate(qk.transpose(0, 1), cos, sin)  # [nh + nkv, T, hd]: q and k rotated together
            q, k = qk[:s.num_heads], qk[s.num_heads:]  # [nh, T, hd], [nkv, T, hd]
            v = qkv[:, self._q_size + self._kv_size:].view(T, s.num_kv_heads, s.head_dim).transpose(0, 1)
            self.k_cache[i][:, L0:L] = k
            self.v_cache[i][:, L0:L] = v
            o = _attention(q, self.k_cache[i][:, :Lp], self.v_cache[i][:, :Lp], L, mask)  # [nh, T, hd]
            x = x + layer.o(o.transpose(0, 1).reshape(T, self._q_size))
            h = self._rms(x, layer.ln2)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)  # [T, I] each
            x = x + layer.down(F.silu(gate) * up)
            if i in tapped:
                tapped[i] = x
        return x

    def _native_layers(self, x: torch.Tensor, L0: int, cos: torch.Tensor, sin: torch.Tensor,
                       tree_mask: torch.Tensor | None, tapped: dict[int, torch.Tensor],
                       out_rows: int | None = None) -> torch.Tensor:
        """The decoder layers on GGUF weights with fused native steps: x [T, H] float32 -> [T, H],
        or, with ``out_rows`` = n < T on a block the loop below runs, its last n rows [n, H]: the
        last layer's attention and MLP run for those rows alone, its keys and values are cached
        for every row (a prefill whose caller reads its last row only: n = 1 for the last piece, 0
        for the others; the last layer is never tapped). Those rows' bits are the same either way,
        every step being row-independent.

        Per layer: rms_quantize -> qkv -> rope_cache (q rotated; k, v into the cache) ->
        attention -> o -> rms_quantize -> gate_up -> swiglu_quantize -> down. Blocks of up to
        ROW_EXACT_MAX tokens (decode steps, drafts, trees) run the whole loop below in one call
        (kernels.Decoder: the same steps, bitwise; ``fused = False`` on an instance runs this loop
        instead); a longer prefill runs the loop, PREFILL_BLOCK rows at a time (_in_blocks). Every
        block attends with the native kernel, whose rows are block-independent and which reads
        only the keys a row sees (causal without a mask): so a prompt's logits are bitwise the
        same prefilled in one block, in chunks or token by token, and a long prefill does not pay
        the batched path's whole-cache scores (700 tokens on a 2-core Zen 5: 2.97 -> 2.21 s).
        """
        s, ops = self.spec, self._ops
        T = x.shape[0]
        if T > PREFILL_BLOCK:
            return self._in_blocks(x, L0, cos, sin, tree_mask, tapped, out_rows)
        L = L0 + T
        cos, sin = cos.contiguous(), sin.contiguous()
        # the kernel attends causally without a mask; only trees (and packed sequences) need one
        mask = self._mask(T, L0, tree_mask) if tree_mask is not None else None
        if T <= ROW_EXACT_MAX and self.fused:
            if not tapped:
                return self._decoder.forward(x, L0, cos, sin, mask)
            x, rows = self._decoder.forward_tapped(x, L0, cos, sin, mask, list(tapped))  # rows [T, k, H]
            for j, i in enumerate(tapped):
                tapped[i] = rows[:, j]
            return x
        last = len(self.layers) - 1
        lap = self._loop_steps.lap  # each step's seconds by kind, as the fused decoder counts them
        self._loop_steps.start()
        for i, layer in enumerate(self.layers):
            kc, vc = self.k_cache[i], self.v_cache[i]
            h = lap("rms_quantize", ops.rms_quantize(x, layer.ln1, s.rms_eps))
            qkv = lap("qkv", layer.qkv.on_quantized(h))  # [T, (nh + 2 nkv) hd]
            q = lap("rope_cache", ops.rope_cache(qkv, cos, sin, kc, vc, L0, s.num_heads,
                                                 *(layer.qk_norm or (None, None)), s.rms_eps))  # [nh, T, hd]
            if i == last and out_rows is not None and out_rows < T:  # every row's k, v are cached
                if out_rows == 0:
                    return x[:0]
                # only the last rows go on: the kernel puts a block of n rows at L - n .. L - 1
                q, x, T = q[:, T - out_rows:].contiguous(), x[T - out_rows:], out_rows
                mask = None if mask is None else mask[-out_rows:].contiguous()
            o = lap("attention", ops.block_attention(q, kc, vc, L, mask))  # [T, nh, hd]
            x = lap("o", x + layer.o(o.reshape(T, self._q_size)))
            h = lap("rms_quantize", ops.rms_quantize(x, layer.ln2, s.rms_eps))
            gate_up = lap("gate_up", layer.gate_up.on_quantized(h))  # [T, 2I]
            h = lap("swiglu_quantize", ops.swiglu_quantize(gate_up))
            x = lap("down", x + layer.down.on_quantized(h))
            if i in tapped:
                tapped[i] = x
        return x

    def _in_blocks(self, x: torch.Tensor, L0: int, cos: torch.Tensor, sin: torch.Tensor,
                   tree_mask: torch.Tensor | None, tapped: dict[int, torch.Tensor],
                   out_rows: int | None = None) -> torch.Tensor:
        """_native_layers over a block x [T, H] longer than PREFILL_BLOCK in pieces of that many rows, each seeing the
        cache up to itself (its rows of the mask over the whole cache, when there is one); with
        ``out_rows`` = n, the block's last n rows [n, H] (each piece gives those of them it holds)."""
        T = x.shape[0]
        mask = None if tree_mask is None else self._mask(T, L0, tree_mask)  # [T, L0 + T]
        outs, pieces = [], {i: [] for i in tapped}
        for s in range(0, T, PREFILL_BLOCK):
            n = min(PREFILL_BLOCK, T - s)
            part = dict.fromkeys(tapped)
            outs.append(self._native_layers(x[s:s + n], L0 + s, cos[s:s + n], sin[s:s + n],
                                            None if mask is None else mask[s:s + n, :L0 + s + n], part,
                                            None if out_rows is None else max(0, out_rows - (T - s - n))))
            for i in tapped:
                pieces[i].append(part[i])
        for i in tapped:
            tapped[i] = torch.cat(pieces[i])
        return torch.cat(outs)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, *, positions: torch.Tensor | None = None,
                tree_mask: torch.Tensor | None = None, last_only: bool = False,
                need_hidden: bool = False, taps: tuple[int, ...] = (),
                hidden_last_only: bool = False, logit_rows: torch.Tensor | None = None) -> ModelOutput:
        """``logit_rows`` [n] (new rows' indices): logits for those rows alone, [n, V] (several
        sequences' rows packed in one forward, specdraft.batch: a prefill's chunk needs none, or
        its last row's); the hidden states, where asked for, stay every row's."""
        T = int(ids.shape[0])
        L0 = self.length
        L = L0 + T
        if self.max_length < L:
            raise ValueError(f"cache overflow: {L} > {self.max_length}")
        self.epoch += 1
        if positions is None:
            cos, sin = self.cos[L0:L], self.sin[L0:L]  # [T, hd]
        else:
            cos, sin = self.cos[positions], self.sin[positions]
        x = self.embed[ids].to(self.dtype)  # [T, H]
        # layer -> its output [T, H], in layer order (filled in by the layers)
        tapped = dict.fromkeys(check_taps(taps, len(self.layers))) if need_hidden else {}
        # the caller reads the last row alone: the native loop skips the others past the last
        # layer's keys and values (the torch path's products may differ by shape: it runs them all)
        one_row = last_only and (not need_hidden or hidden_last_only)
        if self._ops is not None:
            x = self._native_layers(x, L0, cos, sin, tree_mask, tapped, 1 if one_row else None)
        else:
            x = self._torch_layers(x, L0, cos, sin, tree_mask, tapped)
        self.length = L
        if one_row:
            x = x[-1:]
            tapped = {i: t[-1:] for i, t in tapped.items()}
        hidden = self._rms(x, self.norm)  # [T', H]: every row when asked for, else T' = 1 with last_only
        if logit_rows is not None:
            logits = self.lm_head(hidden[logit_rows]).float() if len(logit_rows) else hidden.new_zeros(0, self.vocab_size)
        else:
            logits = self.lm_head(hidden[-1:] if last_only else hidden).float()  # [T' or 1, V]
        return ModelOutput(logits=logits, hidden=hidden if need_hidden else None,
                           taps=torch.stack(list(tapped.values()), 1) if tapped else None)
