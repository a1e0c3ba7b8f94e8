"""A conversation on the terminal: ``specdraft chat``.

Each line typed is the user's next turn; the answer streams back (accepted guesses in green, the
target's own tokens in blue, as ``generate`` prints them) and is kept in the conversation, which
goes through the target's chat template whole at every turn. So each answer is the one the target
gives that conversation, exactly as ``generate`` or the server give it for these messages (greedy:
the same tokens). The speculator's prefix cache keeps the target's cache from one turn to the next,
so a turn prefills only what is new since the last answer, not the whole conversation again.

Lines: a trailing backslash continues the message on the next line; ``/reset`` starts a new
conversation, ``/exit`` (or end of input) ends, ``/help`` lists them. Ctrl-C while an answer
streams stops it where it is (the part said stays in the conversation); at the prompt it ends.
Statistics go to stderr, so that with piped input stdout holds the answers alone, one a line.
"""
from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass, field, replace

from .config import GenerationConfig, SamplingConfig, SpecConfig
from .errors import ContextLengthError, SpecdraftError

HELP = ("a line is a message (end it with \\ to go on on the next line); /reset starts over, "
        "/exit or Ctrl-D ends, Ctrl-C stops an answer")
COMMANDS = ("/reset", "/exit", "/quit", "/help")


@dataclass
class Conversation:
    """The messages so far ([{"role", "content"}], OpenAI's shape), opening with ``system``'s."""

    system: str | None = None
    messages: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def asking(self, text: str) -> list[dict]:
        """The messages with ``text`` as the user's next turn (not kept until it is answered)."""
        return [*self.messages, {"role": "user", "content": text}]

    def answered(self, text: str, answer: str) -> None:
        self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]


class _Interrupts:
    """Ctrl-C while an answer streams: noted (``hit``), so the answer stops at its next piece, the
    engine's state whole (a KeyboardInterrupt inside a forward would leave a check half done)."""

    def __init__(self):
        self.hit = False
        self._old = None

    def __enter__(self):
        self.hit = False
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            self._old = signal.signal(signal.SIGINT, self._note)
        return self

    def _note(self, signum, frame):
        self.hit = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
            self._old = None
        return False


def read_message(read_line) -> str | None:
    """The next message from ``read_line()`` (a line with its newline, "" at the end of input):
    lines ending in a backslash continue it. None at the end of input."""
    parts = []
    while True:
        line = read_line()
        if not line:
            return "\n".join(parts) if parts else None
        line = line.rstrip("\r\n")
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        parts.append(line)
        return "\n".join(parts)


def run_chat(sd, spec: SpecConfig, sampling: SamplingConfig, gen: GenerationConfig, *, read_line,
             conv: Conversation | None = None, out=None, err=None, color: bool = False, stats: bool = True,
             interactive: bool = False) -> int:
    """Talk until the input ends or /exit, in ``conv`` (default: a new one without a system
    message), which holds the conversation after. ``read_line(prompt)`` gives the next line ("" at
    the end); ``interactive``: a terminal (prompts and a banner shown). Returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    conv = conv if conv is not None else Conversation()
    sd.engine(spec)  # the method's drafter, built once now: a bad --head or --index fails before the first turn
    room_total = sd.target.model.max_length
    if interactive:
        print(f"specdraft chat: {sd.target.name}, method {spec.method}; {HELP}", file=err)
    turn = 0
    while True:
        try:
            text = read_message(lambda: read_line("> " if interactive else ""))
        except (KeyboardInterrupt, EOFError):
            text = None
        if text is None:
            if interactive:
                print(file=err)
            return 0
        command = text.strip()
        if not command:
            continue
        if command in ("/exit", "/quit"):
            return 0
        if command == "/help":
            print(HELP, file=err)
            continue
        if command == "/reset":
            conv.reset()
            print("(a new conversation)", file=err)
            continue
        if command.startswith("/") and command.split()[0] in COMMANDS:
            print(f"{command.split()[0]} takes no argument; {HELP}", file=err)
            continue
        try:
            ids = sd.encode_messages(conv.asking(text))
            room = room_total - len(ids)
            if room < 1:
                raise ContextLengthError(f"the conversation ({len(ids)} tokens) fills the context of {room_total} tokens; "
                                     "/reset starts a new one (or start again with a larger --max-context)")
            turn_gen = replace(gen, max_new_tokens=min(gen.max_new_tokens, room))
            engine = sd.engine(spec)  # a turn's engine, as generate's: the drafter (and what it learnt) kept
            pieces = engine.stream(ids, sampling, turn_gen)
            answer = []
            with _Interrupts() as ctrl_c:
                try:
                    for piece in pieces:
                        answer.append(piece.text)
                        if color and piece.text:
                            out.write(f"\x1b[{'32' if piece.origin == 'draft' else '34'}m{piece.text}\x1b[0m")
                        else:
                            out.write(piece.text)
                        out.flush()
                        if ctrl_c.hit:
                            break
                finally:
                    pieces.close()  # the engine's own ending (what the cache holds, recorded) runs now
            out.write("\n")
            out.flush()
        except SpecdraftError as e:  # a turn that cannot run: said in a line, the conversation kept as it was
            print(f"error: {e}", file=err)
            continue
        conv.answered(text, "".join(answer))
        turn += 1
        if stats:
            s = engine.stats
            cached = f"{s.cached_prompt_tokens} of its {s.prompt_tokens} prompt tokens cached" \
                if s.cached_prompt_tokens else f"{s.prompt_tokens} prompt tokens"
            stopped = " (stopped)" if ctrl_c.hit else ""
            line = f"[turn {turn}{stopped}: {cached}, first token after {s.time_prefill:.2f} s; {s.summary()}]"
            print(f"\x1b[2m{line}\x1b[0m" if color else line, file=err)
