"""Tool calling: OpenAI's ``tools`` / ``tool_choice`` over a chat template that takes tools.

The form is the one Qwen2.5's (and Hermes') chat templates teach the model: a call is a JSON object
``{"name": ..., "arguments": {...}}`` on its own line between ``<tool_call>`` and
``</tool_call>``, several calls one after another (vLLM's ``hermes`` parser reads the same). So:

* the request's tools go to the chat template (``tools=``), and earlier turns' calls and results
  (an assistant message's ``tool_calls``, ``tool`` messages) go in as the template reads them
  (arguments as objects, not JSON strings);
* ``tool_choice`` "auto" (the default with tools) lets the model answer or call; "required", or
  one function named, holds the answer to calls (an output format: a Lark grammar with each
  function's parameters as a JSON schema, one-line JSON as the template writes it), so even a
  small model's calls parse, and the format's forced keys are guesses the target checks for free;
  "none" leaves the tools out of the prompt;
* the answer's calls are parsed out of its text (:func:`parse_calls`; a block that does not parse,
  or names no tool of the request, stays text; an answer that is nothing but a call's JSON, bare
  or fenced, as small models often write one, is that call), and a stream holds back the text
  from where a call may begin (:class:`CallStream`), its calls sent as a ``tool_calls`` delta at
  the end.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..config import OutputFormat

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# a call's JSON as the templates write it: one line, ", " and ": " between items (llguidance's options)
_ONE_LINE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
_FENCE_OPEN = "```json"
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


class Function(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    description: str | None = None
    parameters: dict | None = None  # a JSON schema of the arguments (an object); none: no arguments
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: Function


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str | dict = Field(default="{}")  # OpenAI's: a JSON text of an object


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


def check_tools(tools: list[Tool]) -> None:
    """ValueError (a 400) for a name OpenAI would refuse, a name given twice, or parameters that
    are not a JSON schema of an object."""
    seen = set()
    for t in tools:
        name = t.function.name
        if not _NAME.fullmatch(name):
            raise ValueError(f"tool name {name!r}: 1-64 letters, digits, '_' or '-'")
        if name in seen:
            raise ValueError(f"two tools are named {name!r}")
        seen.add(name)
        params = t.function.parameters
        if params is not None and params.get("type", "object") != "object":
            raise ValueError(f"tool {name!r}: parameters must be a JSON schema of an object")


def forced_names(tool_choice, tools: list[Tool] | None) -> list[str] | Literal["none", "auto"]:
    """What ``tool_choice`` asks of the answer: "none", "auto", or the names of the functions it
    must call (every tool's for "required", one for a named function). ValueError for a choice
    OpenAI would refuse."""
    names = [t.function.name for t in tools or []]
    if tool_choice is None:
        return "auto" if names else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise ValueError(f"tool_choice must be none, auto, required or a function, got {tool_choice!r}")
        if tool_choice != "none" and not names:
            raise ValueError(f"tool_choice {tool_choice!r} needs tools")
        return names if tool_choice == "required" else tool_choice
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or \
            not isinstance(tool_choice.get("function"), dict):
        raise ValueError('tool_choice names a function as {"type": "function", "function": {"name": ...}}')
    name = tool_choice["function"].get("name")
    if name not in names:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    return [name]


def tags_are_tokens(tokenizer) -> bool:
    """Whether the tokenizer has ``<tool_call>`` and ``</tool_call>`` as tokens of their own (as
    Qwen2.5's added tokens): a model taught so writes each as that one token, and a format must
    name the token (llguidance matches added tokens by name, not by their text)."""
    return all(len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1 for tag in (OPEN, CLOSE))


def call_format(tools: list[Tool], names: list[str], parallel: bool, tag_tokens: bool = False) -> OutputFormat:
    """The output format of an answer that calls (one of) the functions ``names``: one call, or
    (``parallel``) one or more, each its function's name and arguments its parameters' schema;
    the tags as tokens of their own where ``tag_tokens`` (tags_are_tokens), else as text."""
    bodies = []
    for t in tools:
        if t.function.name in names:
            args = t.function.parameters or _NO_ARGUMENTS
            bodies.append({"type": "object", "properties": {"name": {"const": t.function.name}, "arguments": args},
                           "required": ["name", "arguments"], "additionalProperties": False})
    schema = {**(bodies[0] if len(bodies) == 1 else {"anyOf": bodies}), "x-guidance": _ONE_LINE}
    opening, closing = (OPEN, CLOSE) if tag_tokens else (f'"{OPEN}"', f'"{CLOSE}"')
    call = f'{opening} "\\n" %json {json.dumps(schema)} "\\n" {closing}'
    # (a newline may end the calls, as between them: a model taught so writes one, then its end)
    start = 'start: call ("\\n" call)* "\\n"?' if parallel else 'start: call "\\n"?'
    return OutputFormat("lark", f"{start}\ncall: {call}\n")


def template_tools(tools: list[Tool]) -> list[dict]:
    """The tools as a chat template takes them (OpenAI's objects, unset fields left out)."""
    return [t.model_dump(exclude_none=True) for t in tools]


def template_messages(messages) -> list[dict]:
    """Chat messages (schemas.Message) as the chat template reads them: an assistant's calls with
    their arguments as objects, a tool's result with its call's id and name. ValueError (a 400)
    for arguments that are not a JSON object."""
    out = []
    for m in messages:
        msg = {"role": m.role, "content": m.text}
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                args = c.function.arguments
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        raise ValueError(f"the arguments of a call to {c.function.name!r} are not JSON") from None
                if not isinstance(args, dict):
                    raise ValueError(f"the arguments of a call to {c.function.name!r} are not a JSON object")
                calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
            msg["tool_calls"] = calls
        if m.role == "tool":
            msg.update({k: v for k, v in (("tool_call_id", m.tool_call_id), ("name", m.name)) if v is not None})
        out.append(msg)
    return out


def _call(obj, names: set[str]) -> dict | None:
    """A JSON value as a call in OpenAI's form (arguments as a JSON text, a fresh id), where it is
    an object with a ``name`` among ``names`` and object ``arguments`` (or none); else None."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # (some models write the arguments as a JSON text)
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def _bare_calls(text: str, names: set[str]) -> list[dict]:
    """The calls of an answer that is nothing but a call's JSON (or a list of them), bare or in a
    ```json fence: how small models often answer a tool list (vLLM's JSON tool parsers read the
    same); [] for anything else."""
    s = _FENCE.sub(r"\1", text.strip())
    try:
        value = json.loads(s)
    except ValueError:
        return []
    calls = [_call(v, names) for v in (value if isinstance(value, list) else [value])]
    return calls if calls and all(calls) else []


def parse_calls(text: str, names: set[str]) -> tuple[str, list[dict]]:
    """(the text outside the calls, the calls) of an answer: each ``<tool_call>`` block holding a
    call (a JSON object with a ``name`` among ``names`` and object ``arguments``); failing any,
    the whole answer where it is a call's JSON (_bare_calls); anything else stays text."""
    calls, kept, at = [], [], 0
    for m in _BLOCK.finditer(text):
        try:
            call = _call(json.loads(m.group(1)), names)
        except ValueError:
            call = None
        if call is not None:
            kept.append(text[at:m.start()])
            at = m.end()
            calls.append(call)
    kept.append(text[at:])
    if not calls and (bare := _bare_calls(text, names)):
        return "", bare
    return "".join(kept), calls


def _may_be_bare(text: str) -> bool:
    """Whether a streamed answer so far may still turn out a bare call (_bare_calls): nothing yet
    but whitespace, JSON's start, or a ```json fence with at most JSON's start after it."""
    s = text.lstrip()
    if not s or s[0] in "{[" or _FENCE_OPEN.startswith(s):
        return True
    rest = s[len(_FENCE_OPEN):].lstrip() if s.startswith(_FENCE_OPEN) else None
    return rest is not None and (not rest or rest[0] in "{[")


class CallStream:
    """A streamed answer's text with its calls held back: ``feed`` gives the text that can go out
    now (nothing while the answer may still be a bare call, then all of it up to where a
    ``<tool_call>`` begins, or may be beginning: a partial tag at the end waits for the next
    piece); ``finish`` the rest of the text and the calls."""

    def __init__(self, names: set[str]):
        self.names = names
        self.text = ""
        self.sent = 0  # text[:sent] has gone out
        self.holding = False  # a call began: everything after it waits for the end
        self.bare = True  # the answer so far may be a bare call (_may_be_bare): held

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.holding or (self.bare and _may_be_bare(self.text)):
            return ""
        self.bare = False
        start = self.text.find(OPEN, self.sent)
        if start >= 0:
            self.holding = True
            end = start
        else:
            end = len(self.text) - next((k for k in range(len(OPEN) - 1, 0, -1) if self.text.endswith(OPEN[:k])), 0)
        out, self.sent = self.text[self.sent:end], end
        return out

    def finish(self) -> tuple[str, list[dict]]:
        return parse_calls(self.text[self.sent:], self.names)
