"""The bytes each token id stands for: what log-probabilities name a token by (OpenAI's
``bytes`` field), exact where decoding one id alone is not (half of a multi-byte character).

- byte-level BPE (GPT-2 style: Qwen, Llama 3, SmolLM2): a token's string spells its bytes one
  printable character per byte (:func:`_byte_of_char` undoes that table);
- SentencePiece-style vocabularies (Llama 2, Mistral): ``<0xNN>`` is the byte NN, "▁" a space;
- added tokens (specials such as ``<|im_end|>``) are their text; anything else (a tokenizer with
  no tokenizers-library backend) is its decoded text's UTF-8.
The bytes of the tokens of a byte-level or byte-fallback text, joined, are the text's UTF-8.
"""
from __future__ import annotations

import functools
import json
import re

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """Byte-level BPE's table, inverted: the printable character that stands for each byte.
    Bytes that print as themselves (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) keep their code point;
    the other 68 (controls, space, ...) take 256, 257, ... in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    kept = set(keep)
    table = {chr(b): b for b in keep}
    extra = (b for b in range(256) if b not in kept)
    table.update({chr(256 + i): b for i, b in enumerate(extra)})
    return table


class TokenBytes:
    """``tb(id)`` -> the bytes of token ``id`` under ``tokenizer`` (transformers' or
    models.tokenizer.Tokenizer); ``tb.text(id)`` -> those bytes as text (U+FFFD for an incomplete
    character). Looked up once per id."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend = backend
        self._byte_level = False
        self._added: dict[int, str] = {}
        if backend is not None:
            decoder = backend.decoder
            state = json.loads(decoder.__getstate__()) if decoder is not None else {}
            kinds = [d.get("type") for d in state.get("decoders", [state])]
            self._byte_level = "ByteLevel" in kinds
            self._added = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
        self._seen: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        got = self._seen.get(token_id)
        if got is None:
            got = self._seen[token_id] = self._bytes(token_id)
        return got

    def text(self, token_id: int) -> str:
        return self(token_id).decode("utf-8", errors="replace")

    def _bytes(self, i: int) -> bytes:
        if i in self._added:
            return self._added[i].encode()
        piece = self._backend.id_to_token(i) if self._backend is not None else None
        if piece is None:  # no backend, or an id past the vocabulary
            return self.tok.decode([i]).encode()
        if self._byte_level:
            table = _byte_of_char()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
            return self.tok.decode([i]).encode()
        byte = _BYTE_TOKEN.fullmatch(piece)
        if byte:
            return bytes([int(byte.group(1), 16)])
        return piece.replace("\u2581", " ").encode()
