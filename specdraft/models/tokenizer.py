"""A model directory's tokenizer without importing transformers on later starts.

transformers loads a ``tokenizer.json`` as a tokenizers-library object plus the special tokens
and chat template of ``tokenizer_config.json`` (and may amend the object as it loads). The
first load here goes through transformers, as before, and snapshots what it made
(models.snapshots): the special tokens and their ids, the chat template, and the backend
object where it differs from the file. Later loads build :class:`Tokenizer` from the snapshot
with the tokenizers library alone (~0.3 s for Qwen2.5's 151k tokens, against ~1.4 s with
transformers' import).

:class:`Tokenizer` does what specdraft asks of a tokenizer, as transformers' fast tokenizer does
it: encode (``tok(text)["input_ids"]``), decode, the vocabulary, special tokens, and the chat
template over plain messages (role / content strings), rendered by jinja2 in the sandbox and
with the extras transformers gives a template. Any other call (tools, documents, rich message
parts) goes to transformers' own tokenizer, loaded on first need, so nothing renders otherwise.
"""
from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path

from . import snapshots

_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
          "chat_template.jinja", "chat_template.json")
_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_PLAIN_KEYS = {"role", "content", "name"}  # message keys the fast chat template takes (string values)


def transformers_tokenizer(path: str | Path):
    """transformers' tokenizer of the directory: a ``tokenizer.json`` is read as it is (0.5 s for
    Qwen2.5's, against 0.85 s through the model's own tokenizer class, which parses the file again
    in Python); a directory without one goes through AutoTokenizer."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if (Path(path) / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def load_tokenizer(path: str | Path):
    """The tokenizer of the model directory ``path``: a :class:`Tokenizer` from its snapshot, else
    transformers' (raising what it raises), snapshotted where a Tokenizer can stand in for it."""
    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        return transformers_tokenizer(path)
    digest = snapshots.key(path, _FILES)
    saved = snapshots.load("tokenizer", digest)
    if saved is not None:
        try:
            return Tokenizer.from_snapshot(path, saved)
        except Exception:  # a damaged snapshot: the slow way, which writes it again
            pass
    tok = transformers_tokenizer(path)
    payload = _snapshot(path, tok)
    if payload is None:
        return tok
    snapshots.save("tokenizer", digest, payload)
    fast = Tokenizer.from_snapshot(path, payload, backend=tok.backend_tokenizer)
    fast._slow = tok  # loaded already: what the fast path does not cover goes to it
    return fast


def _snapshot(path: Path, tok) -> dict | None:
    """What a Tokenizer needs of transformers' ``tok``, or None where it cannot stand in for it:
    a slow tokenizer, several named chat templates, or decoding that cleans up spaces."""
    if not getattr(tok, "is_fast", False):
        return None
    template = tok.chat_template
    if template is not None and not isinstance(template, str):
        return None
    cleanup = bool(tok.clean_up_tokenization_spaces) and not (
        type(tok.backend_tokenizer.model).__name__ == "BPE"
        and not getattr(tok, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False))
    if cleanup:
        return None
    backend = tok.backend_tokenizer.to_str()
    try:
        same = json.loads(backend) == json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        same = False
    special = tok.special_tokens_map
    return {
        "backend": None if same else backend,  # None: the directory's tokenizer.json as it is
        "special": {name: [str(special[name]), getattr(tok, f"{name}_id")] for name in _SPECIAL if name in special},
        "chat_template": template,
        "split_special_tokens": bool(getattr(tok, "split_special_tokens", False)),
    }


class Tokenizer:
    """The tokenizers-library tokenizer of a model directory, with transformers' special tokens
    and chat template; see the module docstring for what it covers."""

    def __init__(self, source: Path, backend, special: dict[str, tuple[str, int | None]], chat_template: str | None,
                 split_special_tokens: bool = False):
        self.source = Path(source)  # the model directory (transformers' tokenizer loads from it on need)
        self.backend_tokenizer = backend
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = split_special_tokens
        self.chat_template = chat_template
        self._special = dict(special)
        self._slow = None

    @classmethod
    def from_snapshot(cls, source: Path, saved: dict, backend=None) -> Tokenizer:
        from tokenizers import Tokenizer as Backend

        if backend is None:
            text = saved["backend"]
            backend = Backend.from_str(text) if text is not None else Backend.from_file(str(Path(source) / "tokenizer.json"))
        special = {name: (token, token_id) for name, (token, token_id) in saved["special"].items()}
        return cls(source, backend, special, saved["chat_template"], bool(saved.get("split_special_tokens", False)))

    # ------------------------------------------------------------------ special tokens
    @property
    def special_tokens_map(self) -> dict[str, str]:
        return {name: token for name, (token, _) in self._special.items()}

    def __getattr__(self, name: str):
        # bos_token, eos_token_id, ...: None where the tokenizer has no such token, as in transformers
        base = name[:-3] if name.endswith("_id") else name
        if base in _SPECIAL:
            entry = self._special.get(base)
            return None if entry is None else entry[1 if name.endswith("_id") else 0]
        raise AttributeError(name)

    # ------------------------------------------------------------------ vocabulary
    @property
    def vocab_size(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self.backend_tokenizer.token_to_id(tokens)
        return [self.backend_tokenizer.token_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        return [self.backend_tokenizer.id_to_token(i) for i in ids]

    # ------------------------------------------------------------------ encode / decode
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict[str, list]:
        """{"input_ids", "attention_mask"} of one text (lists of ints) or of several (lists of lists)."""
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        ids = [e.ids for e in self.backend_tokenizer.encode_batch(list(text), add_special_tokens=add_special_tokens)]
        return {"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, int):
            ids = [ids]
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ chat template
    def apply_chat_template(self, conversation, *, add_generation_prompt: bool = False, tokenize: bool = True,
                            **kwargs):
        """The conversation rendered by the chat template (tokenize=False: the text; True: as
        transformers 5 gives it, {"input_ids", "attention_mask"} of the text without added special
        tokens). Plain messages only; anything else is transformers' job."""
        if kwargs or self.chat_template is None or not _plain(conversation):
            return self.transformers().apply_chat_template(conversation, add_generation_prompt=add_generation_prompt,
                                                           tokenize=tokenize, **kwargs)
        messages = [dict(m) for m in conversation]
        text = _compiled(self.chat_template).render(messages=messages, tools=None, documents=None,
                                                    add_generation_prompt=add_generation_prompt,
                                                    **self.special_tokens_map)
        return self(text, add_special_tokens=False) if tokenize else text

    def transformers(self):
        """transformers' own tokenizer of the same directory, loaded once."""
        if self._slow is None:
            self._slow = transformers_tokenizer(self.source)
        return self._slow


def _plain(conversation) -> bool:
    """One conversation of dict messages whose keys are role / content / name and values strings."""
    return isinstance(conversation, list) and len(conversation) > 0 and all(
        isinstance(m, dict) and set(m) <= _PLAIN_KEYS and "role" in m and all(type(v) is str for v in m.values())
        for m in conversation)


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    """The template compiled in the environment transformers renders chat templates in: jinja2's
    immutable sandbox, trim_blocks and lstrip_blocks, loop controls, a ``{% generation %}`` block
    (rendered as its body), tojson without HTML escaping, raise_exception, strftime_now, and dict /
    namespace constructors that refuse underscore names."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        tags = frozenset({"generation"})

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template may not set {name!r} on a namespace")

    class Dict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f),
                       dict=Dict(), namespace=Namespace)
    return env.from_string(template)
