"""models.token_bytes: the bytes each token id stands for, as log-probabilities name tokens.

Tiny tokenizers built here with the tokenizers library, of the two kinds models ship: byte-level
BPE (Qwen, Llama 3, SmolLM2) and SentencePiece-style with byte fallback (Llama 2, Mistral).
"""
from __future__ import annotations

import pytest

from specdraft.models.token_bytes import TokenBytes, _byte_of_char

TEXT = "Hello wörld, 你好 🙂!\n\tdef f(x): return x  # ünïcode"


def _fast(tok, **special):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


@pytest.fixture(scope="module")
def byte_level():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|end|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT * 3, "Hello world, hello wörld. def g(y): return y"], trainer)
    return _fast(tok, eos_token="<|end|>")


def test_the_byte_table_is_a_bijection():
    table = _byte_of_char()
    assert sorted(table.values()) == list(range(256)) and len(table) == 256
    assert table["!"] == ord("!") and table["\u0120"] == ord(" ") and table["\u010a"] == ord("\n")


def test_byte_level_tokens_join_to_the_text(byte_level):
    tb = TokenBytes(byte_level)
    text = TEXT + " 🚀€"  # characters the merges never saw: a token a byte
    ids = byte_level.encode(text, add_special_tokens=False)
    assert b"".join(tb(i) for i in ids) == text.encode()
    # a token that is part of a character: its bytes exact, its text with U+FFFD
    partial = [i for i in ids if len(tb(i)) == 1 and tb(i)[0] >= 0x80]
    assert partial and all(tb.text(i) == "\ufffd" for i in partial)
    end = byte_level.convert_tokens_to_ids("<|end|>")
    assert tb(end) == b"<|end|>" and tb.text(end) == "<|end|>"


def test_byte_fallback_tokens_join_to_the_text():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for piece in ("\u2581", "h", "i", "\u2581h", "\u2581hi", "!", "</s>"):
        vocab[piece] = len(vocab)
    merges = [("\u2581", "h"), ("\u2581h", "i")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    fast = _fast(tok, eos_token="</s>")
    tb = TokenBytes(fast)
    text = "hi hi 🙂!"
    ids = fast.encode(text, add_special_tokens=False)
    assert vocab["\u2581hi"] in ids and vocab["<0xF0>"] in ids  # merged pieces and fallback bytes both
    assert b"".join(tb(i) for i in ids) == b" " + text.encode()  # the leading "▁" a space, as SentencePiece
    assert tb(vocab["<0x0A>"]) == b"\n"


def test_a_tokenizer_without_a_backend_is_spelled_by_decoding():
    class Plain:
        def decode(self, ids, skip_special_tokens=False):
            return "".join("ab"[i % 2] for i in ids)

    tb = TokenBytes(Plain())
    assert tb(0) == b"a" and tb(3) == b"b" and tb.text(2) == "a"
