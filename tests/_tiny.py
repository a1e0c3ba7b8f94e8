"""Tiny random Llama-family models and a fake tokenizer, built in-process for the fast tier.

Nothing is downloaded: models are random transformers modules (2 layers, hidden 64), saved as
Hugging Face directories so the native runtime loads them through its real loader.
"""
from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 96
MAX_POS = 256


def make_config(kind: str = "qwen2", *, vocab: int = VOCAB, tie: bool = False, layers: int = 2):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    cls = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}[kind]
    # qwen3: q / k heads RMS-normalised, and heads wider than hidden / heads (as Qwen3-0.6B's 16 x 128 over 1024)
    extra = {"head_dim": 32} if kind == "qwen3" else {}
    cfg = cls(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POS,
              tie_word_embeddings=tie, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None,
              pad_token_id=None, **extra)
    cfg._attn_implementation = "eager"  # the reference: plain math, no fused kernels
    return cfg


def build_hf(kind: str = "qwen2", *, seed: int = 0, tie: bool = False, vocab: int = VOCAB, scale: float = 0.2,
             layers: int = 2):
    """A random fp32 transformers model whose every weight (norms and biases too) is non-trivial."""
    from transformers import AutoModelForCausalLM

    cfg = make_config(kind, vocab=vocab, tie=tie, layers=layers)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))
    return model


def perturbed(model, *, seed: int, noise: float):
    """A copy of ``model`` with Gaussian noise on every weight: a draft that mostly agrees."""
    import copy

    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(noise * torch.randn(p.shape, generator=g))
    return other


def save(model, directory: Path) -> Path:
    """Save as a Hugging Face model dir: config.json + model.safetensors."""
    from safetensors.torch import save_model

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if model.config.tie_word_embeddings:
        # safetensors.save_model keeps only one name of a shared tensor (lm_head.weight);
        # transformers' own writer keeps model.embed_tokens.weight, as real checkpoints do.
        model.save_pretrained(directory)
    else:
        model.config.save_pretrained(directory)
        save_model(model, str(directory / "model.safetensors"))
    return directory


def tree_target(weight_format: str, directory: Path):
    """A tiny qwen2 LlamaModel (max_length 256) saved into ``directory`` and loaded dense (fp32, the
    torch path) or q4k (the native kernels; the test is skipped where they do not build); its
    ``source_dir`` is ``directory``."""
    import pytest

    from specdraft.models.llama import LlamaModel

    if weight_format == "q4k":
        from specdraft.kernels import KernelUnavailable, gguf_ops

        try:
            gguf_ops()
        except KernelUnavailable as e:
            pytest.skip(str(e))
    d = save(build_hf("qwen2", seed=0), directory)
    model = LlamaModel.from_dir(d, dtype=torch.float32, max_length=256, weight_format=weight_format)
    model.source_dir = d
    return model


def load_native(directory: Path, max_length: int = MAX_POS, dtype: torch.dtype = torch.float32):
    from specdraft.models.llama import LlamaModel

    return LlamaModel.from_dir(directory, dtype=dtype, max_length=max_length)


ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,;:!?0123456789-+*/=()[]{}<>#@$%&_'\"|~^"


class FakeTokenizer:
    """Token i decodes to one printable character (ids past the alphabet wrap around)."""

    def __init__(self, special: set[int] | None = None):
        self.special = set(special or ())

    def piece(self, i: int) -> str:
        return ALPHABET[i % len(ALPHABET)]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.piece(int(i)) for i in ids if not (skip_special_tokens and int(i) in self.special))


class ByteTokenizer:
    """Token i is the byte i; decodes like a byte-level BPE: invalid/incomplete UTF-8 -> U+FFFD."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def save_char_tokenizer(directory: Path, *, vocab: int = VOCAB, shuffle_seed: int | None = None,
                        byte_level: bool = False) -> None:
    """A character-level fast tokenizer (token i = ALPHABET[i], last id = <eos>) saved into ``directory``.

    ``shuffle_seed`` permutes the ids, giving a tokenizer with a different vocabulary mapping;
    ``byte_level``: GPT-2's byte-level form (as Qwen's and Llama 3's tokenizers; the same ids and
    texts), which llguidance (structured output) reads.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(ALPHABET[: vocab - 1])
    if shuffle_seed is not None:
        perm = torch.randperm(len(chars), generator=torch.Generator().manual_seed(shuffle_seed)).tolist()
        chars = [chars[i] for i in perm]
    if byte_level:  # (ids without holes up to <eos>: a newline and a backslash after the alphabet)
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        chars += [ch for ch in "\n\\`\t" if ch not in chars][:vocab - 1 - len(chars)]

        shown = bytes_to_unicode()
        chars = [shown[ord(ch)] for ch in chars]
    table = {ch: i for i, ch in enumerate(chars)}
    table["<eos>"] = vocab - 1
    tok = Tokenizer(models.BPE(vocab=table, merges=[], unk_token=None))
    if byte_level:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
    else:
        tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.save_pretrained(str(directory))


def make_cli_model(directory: Path, *, seed: int = 0, shuffle_seed: int | None = None,
                   byte_level: bool = False) -> Path:
    """A complete tiny model dir (weights, config, char tokenizer) that load_model accepts."""
    directory = save(build_hf("qwen2", seed=seed), directory)
    save_char_tokenizer(directory, shuffle_seed=shuffle_seed, byte_level=byte_level)
    return directory


def drafting_engine(target, method, head=None, **spec_kw):
    """An Engine on a tiny target whose drafter reads a trained head (cost rule off by default:
    drafts are sent whatever this machine's forward times)."""
    from specdraft.config import SpecConfig
    from specdraft.drafters import DrafterContext, build_drafter
    from specdraft.engine import Engine

    spec_kw.setdefault("cost_rule", False)
    spec = SpecConfig(method=method, min_confidence=0.0, **spec_kw)
    drafter = None if method == "none" else build_drafter(method, DrafterContext(spec, target, None, head))
    return Engine(target, FakeTokenizer(), drafter, spec)


def own_texts(target, n: int = 24, length: int = 60) -> list[list[int]]:
    """n random 6-token prompts each followed by the target's own greedy continuation: what a
    drafter trained on the target's features learns from."""
    from specdraft.config import GenerationConfig, SamplingConfig

    gen = torch.Generator().manual_seed(0)
    seqs = []
    for _ in range(n):
        prompt = torch.randint(0, VOCAB, (6,), generator=gen).tolist()
        e = drafting_engine(target, "none")
        e.generate(prompt, SamplingConfig(), GenerationConfig(max_new_tokens=length))
        seqs.append(prompt + list(e.token_ids))
    return seqs


def drafted(target, method, prompt, head=None, sampling=None, n: int = 40, **spec_kw):
    """(token ids, stats) of ``n`` new tokens of ``prompt`` with drafting_engine's engine."""
    from specdraft.config import GenerationConfig, SamplingConfig

    e = drafting_engine(target, method, head, **spec_kw)
    e.generate(prompt, sampling or SamplingConfig(), GenerationConfig(max_new_tokens=n))
    return list(e.token_ids), e.stats


def greedy_runs_equal_plain(target, method, head, prompts, **spec_kw) -> list:
    """Greedy decoding of every prompt with ``method`` gives plain decoding's tokens, and drafts
    are made; returns each run's stats."""
    runs = []
    for prompt in prompts:
        plain, _ = drafted(target, "none", prompt)
        ids, stats = drafted(target, method, prompt, head, **spec_kw)
        assert ids == plain
        assert stats.drafts > 0 and stats.draft_tokens > 0
        runs.append(stats)
    return runs


def eagle_chain(drafter, rows, context: list[int], n: int) -> list:
    """An EAGLE drafter fed the committed rows [n, ...] as the engine hands them over (in two
    parts: a prefill, then a verification), then stepping a chain of the true next tokens from
    committed position n-1: its outputs [h_0, h_1, h_2] (unread), what training's unroll gives
    at start n-1. context: the tokens, at least n + 3."""
    drafter.begin(context[:n - 4])
    drafter.take_features(rows[:n - 5])
    drafter.context = context[:n - 3]
    drafter.advance([-1], [context[n - 4]], [], [])
    drafter.take_features(rows[n - 5:])
    drafter.context = context[:n + 1]
    got = [drafter.advance([-1], [context[n]], [], [])[0]]
    parents, feats = [], []
    for j in (1, 2):  # node j-1 holds the true token x_{n+j}, chosen from the previous output
        parents.append(j - 2)
        feats.append(got[-1])
        got.append(drafter.advance([j - 1], [context[n + j]], parents, feats)[0])
    return got


def tapped_unroll_and_chain(model, data, head, n: int = 10) -> tuple[list, list]:
    """For an EAGLE drafter with taps over recorded features ``data``: training's unroll at start
    n-1 of the first document (its 3 outputs, read out) and the drafter's chain there (fp32, its
    module's own matrices; the raw outputs of eagle_chain)."""
    from specdraft.heads.eagle_train import _gather, unrolled

    a, b = int(data.starts[0]), int(data.starts[1])
    feats, tokens, _, pos, lengths, aux, _ = _gather(data, [(a, b - a, 0)], data.top, taps=True)
    want = [h[0, n - 1] for h, _ in unrolled(head, feats, tokens, pos, lengths, model.embed, 3, aux)]
    drafter = drafting_engine(model, "eagle", head).drafter
    drafter.step = None  # the module's own fp32 matrices, as training ran them
    drafter.fuse = None
    rows = torch.cat([data.aux[a:a + n].float().flatten(1), data.features[a:a + n].float()], -1)  # as the engine gives
    return want, eagle_chain(drafter, rows, data.tokens[a:a + n + 3].tolist(), n)


def eagle_round_trip_decodes(model, head, directory, cls, ids, prompts) -> None:
    """An EAGLE drafter with listed ids ``ids`` saved to and loaded from ``directory`` is the same
    class, config and ids, and decodes exactly as plain greedy decoding with chains and trees,
    its guesses accepted."""
    from specdraft.heads.model import load_head

    head.save(directory)
    back = load_head(directory, "eagle")
    assert isinstance(back, cls) and back.cfg == head.cfg and torch.equal(back.vocab_ids, ids)
    for trees in (False, True):
        runs = greedy_runs_equal_plain(model, "eagle", back, prompts, trees=trees)
        assert sum(s.accepted_tokens for s in runs) > 0


# a made-up chat template for the character tokenizer: "<user>...[/]<assistant>"
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}[/]{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def chat_target(directory: Path, *, seed: int = 3):
    """(native model, tokenizer with CHAT_TEMPLATE) of a tiny random qwen2 saved into ``directory``."""
    from transformers import AutoTokenizer

    save(build_hf("qwen2", seed=seed), directory)
    save_char_tokenizer(directory)
    tok = AutoTokenizer.from_pretrained(str(directory))
    tok.chat_template = CHAT_TEMPLATE
    return load_native(directory), tok


def tiny_client(sd, spec=None, **config):
    """A test client of the server over ``sd`` as model "tiny" (server errors come back as
    responses): ``spec`` its default speculation (a draft-model chain of 4 with the cost rule
    off, so drafts go out whatever this CPU's speed), ``config`` the rest of its ServerConfig."""
    from fastapi.testclient import TestClient

    from specdraft.config import SpecConfig
    from specdraft.server.app import ServerConfig, create_app

    spec = spec or SpecConfig(method="draft-model", k=4, min_confidence=0.0, cost_rule=False)
    return TestClient(create_app(sd, ServerConfig(model_name="tiny", spec=spec, **config)), raise_server_exceptions=False)


# a chat template that lists the tools and writes calls and results as Qwen2.5's does (in short)
TOOLS_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t['function']['name'] }};{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}"
    "<tool_call>\n{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}\n"
    "</tool_call>{% endfor %}{% else %}{{ m['content'] }}{% endif %}[/]{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 12},
                                                "days": {"type": "integer", "minimum": 1, "maximum": 9}},
                                                "required": ["city", "days"], "additionalProperties": False}}}
NOOP = {"type": "function", "function": {"name": "noop"}}


def tools_speculator(directory: Path):
    """A Speculator over a tiny byte-level model (its own draft) whose chat template takes tools
    (TOOLS_TEMPLATE), in w8a8 with a context of 256."""
    import json

    from specdraft.pipeline import Speculator

    d = make_cli_model(directory, byte_level=True)
    config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TOOLS_TEMPLATE}))
    return Speculator(str(d), str(d), dtype="fp32", draft_format="w8a8", target_format="w8a8", max_length=256,
                      progress=False)
