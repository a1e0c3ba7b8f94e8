"""specdraft chat: each answer is the target's own answer to the conversation so far (the same
tokens as a fresh generation over those messages), each turn after the first prefills only its
new tail, and a turn that cannot run or an answer stopped early leaves the conversation whole."""
from __future__ import annotations

import io
import os
import signal
import sys

import pytest

from _tiny import make_cli_model
from specdraft.chat import Conversation, read_message, run_chat
from specdraft.cli import main
from specdraft.config import GenerationConfig, SamplingConfig, SpecConfig
from specdraft.pipeline import Speculator

# a draft-model chain of 4 with the cost rule off: drafts go out whatever this CPU's speed
DRAFTING = SpecConfig(method="draft-model", k=4, min_confidence=0.0, cost_rule=False)
NEW = 20


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(make_cli_model(tmp_path_factory.mktemp("chat") / "tiny"))


@pytest.fixture(scope="module")
def sd(tiny_dir):
    return Speculator(tiny_dir, tiny_dir, dtype="fp32", target_format="w8a8", draft_format="w8a8", max_length=256,
                      progress=False, reuse_prefix=True, prefix_budget_mb=0)


def fresh_answer(tiny_dir, messages: list[dict], new: int = NEW) -> str:
    """Plain decoding's answer to ``messages`` in a speculator of its own (no cache carried over)."""
    other = Speculator(tiny_dir, dtype="fp32", target_format="w8a8", max_length=256, progress=False, load_draft=False)
    return other.generate(other.encode_messages(messages), spec=SpecConfig(method="none"),
                          gen=GenerationConfig(max_new_tokens=new)).text


def talk(sd, lines: list[str], spec=DRAFTING, new: int = NEW, out=None, system=None) -> tuple[list[str], str, int]:
    """(the answers, what went to stderr, the exit status) of run_chat over ``lines``; each answer
    as the conversation keeps it, and checked to be what stdout showed."""
    feed = iter(line + "\n" for line in lines)
    out = out or io.StringIO()
    err = io.StringIO()
    conv = Conversation(system)
    rc = run_chat(sd, spec, SamplingConfig(), GenerationConfig(max_new_tokens=new),
                  read_line=lambda prompt: next(feed, ""), conv=conv, out=out, err=err)
    answers = [m["content"] for m in conv.messages if m["role"] == "assistant"]
    if "/reset" not in lines:  # (a reset forgets the answers before it)
        assert out.getvalue() == "".join(a + "\n" for a in answers)
    return answers, err.getvalue(), rc


def test_each_answer_is_the_targets_own_for_the_conversation_so_far(sd, tiny_dir):
    answers, err, rc = talk(sd, ["abcabc", "bca", "cab abc"])
    assert rc == 0 and len(answers) == 3
    messages = []
    for question, answer in zip(["abcabc", "bca", "cab abc"], answers):
        messages.append({"role": "user", "content": question})
        assert answer == fresh_answer(tiny_dir, messages)
        messages.append({"role": "assistant", "content": answer})
    turns = [line for line in err.splitlines() if line.startswith("[turn ")]
    assert len(turns) == 3 and "draft-model" in turns[0]
    assert "cached" not in turns[0] and "cached" in turns[1] and "cached" in turns[2]  # later turns reuse the cache
    assert "acceptance" in " ".join(turns)  # the drafter's guesses were checked


def test_a_system_message_and_a_reset(sd, tiny_dir):
    out = io.StringIO()
    answers, err, rc = talk(sd, ["abc", "/reset", "abc", "/help", "", "/exit", "never read"], system="bca bca", out=out)
    assert rc == 0 and len(answers) == 1  # the conversation since /reset
    first = fresh_answer(tiny_dir, [{"role": "system", "content": "bca bca"}, {"role": "user", "content": "abc"}])
    assert out.getvalue() == f"{first}\n{first}\n"  # after /reset the conversation is the system message alone again
    assert "a new conversation" in err and "/reset starts over" in err


def test_a_backslash_continues_a_message():
    lines = iter(["ab\\\n", "c\\\n", "d\n", "e\n"])
    assert read_message(lambda: next(lines, "")) == "ab\nc\nd"
    assert read_message(lambda: next(lines, "")) == "e"
    assert read_message(lambda: next(lines, "")) is None
    tail = iter(["x\\\n"])  # the input ends inside a message: what was read
    assert read_message(lambda: next(tail, "")) == "x"


def test_a_turn_past_the_context_is_one_line_and_the_conversation_goes_on(sd, tiny_dir):
    answers, err, rc = talk(sd, ["abc", "x" * 300, "bca"])
    assert rc == 0 and len(answers) == 2
    assert "error: the conversation" in err and "fills the context of 256 tokens" in err
    conv = Conversation()
    conv.answered("abc", answers[0])
    assert answers[1] == fresh_answer(tiny_dir, conv.asking("bca"))  # the refused turn left no trace


def test_an_answer_near_the_end_of_the_context_is_cut_to_the_room_left(sd, tiny_dir):
    question = "abc" * 75  # its prompt leaves fewer than NEW positions
    ids = sd.encode_messages([{"role": "user", "content": question}])
    room = 256 - len(ids)
    assert 0 < room < 40
    answers, err, rc = talk(sd, [question], new=40)
    assert rc == 0 and "error" not in err
    assert answers[0] == fresh_answer(tiny_dir, [{"role": "user", "content": question}], new=room)


class _CtrlCAfter(io.StringIO):
    """stdout that sends this process a SIGINT once ``after`` pieces of text were written."""

    def __init__(self, after: int):
        super().__init__()
        self.after = after

    def write(self, s):
        self.after -= 1
        if self.after == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return super().write(s)


def test_ctrl_c_stops_an_answer_and_the_next_turn_still_answers_the_conversation(sd, tiny_dir):
    out = _CtrlCAfter(3)
    answers, err, rc = talk(sd, ["abcabc", "bca"], out=out)
    assert rc == 0 and len(answers) == 2
    full = fresh_answer(tiny_dir, [{"role": "user", "content": "abcabc"}])
    assert full.startswith(answers[0]) and len(answers[0]) < len(full)  # stopped part way
    assert "(stopped)" in err
    conv = Conversation()
    conv.answered("abcabc", answers[0])
    assert answers[1] == fresh_answer(tiny_dir, conv.asking("bca"))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_the_command_reads_stdin_and_prints_the_answers(tiny_dir, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("abcabc\nbca\n"))
    rc = main(["chat", "--target", tiny_dir, "--method", "prompt-lookup", "--dtype", "fp32", "--target-format", "w8a8",
               "--max-context", "256", "--max-new-tokens", str(NEW), "--color", "never"])
    got = capsys.readouterr()
    assert rc == 0
    first = fresh_answer(tiny_dir, [{"role": "user", "content": "abcabc"}])
    assert got.out.startswith(first + "\n") and got.out.endswith("\n")
    assert got.err.count("[turn ") == 2 and "prompt-lookup" in got.err


def test_the_command_refuses_bad_parameters_in_one_line(tiny_dir, capsys):
    assert main(["chat", "--target", tiny_dir, "--max-new-tokens", "0"]) == 2
    assert main(["chat", "--target", tiny_dir, "--temperature", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)
