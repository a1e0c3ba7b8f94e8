"""Request bodies of the OpenAI-compatible endpoints (pydantic), with their limits.

Unknown fields are ignored (OpenAI clients send many), known ones are type-checked and
range-checked here, so a bad request is a 400 before it reaches the queue. Two extension
fields pick the speculation per request: ``method`` (a drafter name or "none") and ``k``; a third,
``ignore_eos`` (vLLM's name), generates past end-of-sequence tokens up to the token limit;
``repetition_penalty`` and ``min_p`` are vLLM's too. Log-probabilities: chat's ``logprobs`` / ``top_logprobs``,
completions' ``logprobs`` (an int).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictInt, field_validator, model_validator

from .. import grammar
from ..config import MAX_CHOICES, MAX_REPETITION_PENALTY, MAX_TOP_LOGPROBS, OutputFormat
from ..errors import SpecdraftError
from . import tools
from .tools import Tool, ToolCall

MAX_STOP = 4  # as OpenAI
MAX_TOOLS = 128  # as OpenAI


class Sampled(BaseModel):
    """The fields every generation endpoint's body shares (chat and completions, the Responses
    and Messages APIs): the model, how tokens are drawn, streaming, and this server's extensions
    ``method`` (a drafter name or "none") and ``k`` (draft tokens per step)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None  # None: the served model
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)  # extension, as vLLM's
    seed: StrictInt | None = Field(default=None, ge=0, le=2**63 - 1)
    stream: StrictBool = False
    method: str | None = None
    k: StrictInt | None = Field(default=None, ge=1, le=64)


class _Common(Sampled):
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)  # newer OpenAI name
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=MAX_REPETITION_PENALTY)  # extension, as vLLM's
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    # OpenAI fields this server does not do: refused (400) rather than ignored, when they ask for something
    response_format: dict | None = None
    stop: str | list[str] | None = None
    n: StrictInt = Field(default=1, ge=1, le=MAX_CHOICES)  # completions per prompt (decoded together: specdraft.batch)
    stream_options: dict | None = None
    ignore_eos: StrictBool = False  # extension (as vLLM's): generate past EOS, up to max_tokens

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        if v is None:
            return v
        try:
            bias = {int(k): float(b) for k, b in v.items()}
        except ValueError:
            raise ValueError("keys are token ids (integers, as strings)") from None
        if any(i < 0 or not -100 <= b <= 100 for i, b in bias.items()):
            raise ValueError("token ids >= 0, biases in [-100, 100]")
        return {str(i): b for i, b in bias.items()}

    # vLLM's structured-output fields: one of json (a schema), regex, choice (a list), grammar (Lark)
    structured_outputs: dict | None = None
    guided_json: dict | str | None = None  # vLLM's older names for the same
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    _output_format: OutputFormat | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _format(self):
        self._output_format = _output_format(self)
        return self

    @property
    def output_format(self) -> OutputFormat | None:
        """What the answer must be (config.OutputFormat), from response_format or vLLM's fields."""
        return self._output_format

    @property
    def bias(self) -> dict[int, float]:
        return {int(k): b for k, b in (self.logit_bias or {}).items()}

    @property
    def prompt_logprob_count(self) -> int | None:
        return None  # completions' echo scores the prompt (CompletionRequest)

    @model_validator(mode="after")
    def _choices(self):
        count = self.n * len(self.prompts)
        if count > MAX_CHOICES:
            raise ValueError(f"at most {MAX_CHOICES} choices (prompts x n) a request, got {count}")
        return self

    @property
    def prompts(self) -> list:
        return [None]  # chat: the messages (CompletionRequest: its prompts)

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def _output_format(body) -> OutputFormat | None:
    """The one output format a request asks for (ValueError, a 400, for two, or a bad one)."""
    asked = []
    rf = body.response_format
    if rf is not None:
        kind = rf.get("type", "text")
        if kind == "json_object":
            asked.append(OutputFormat("json"))
        elif kind == "json_schema":
            spec = rf.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise ValueError("response_format json_schema needs json_schema.schema (an object)")
            asked.append(OutputFormat.schema(spec["schema"]))
        elif kind != "text":
            raise ValueError(f"response_format type must be text, json_object or json_schema, got {kind!r}")
    so = dict(body.structured_outputs or {})
    for key, value in (("json", body.guided_json), ("regex", body.guided_regex), ("choice", body.guided_choice),
                       ("grammar", body.guided_grammar)):
        if value is not None:
            so.setdefault(key, value)
    unknown = sorted(set(so) - {"json", "regex", "choice", "grammar"})
    if unknown:
        raise ValueError(f"structured_outputs takes json, regex, choice or grammar, not {', '.join(unknown)}")
    for key, value in so.items():
        try:
            if key == "json":
                asked.append(OutputFormat.schema(value) if isinstance(value, (dict, str)) else OutputFormat("json_schema", ""))
            elif key == "choice":
                if not isinstance(value, list):
                    raise ValueError("structured_outputs choice must be a list of strings")
                asked.append(OutputFormat.choices(value))
            else:
                asked.append(OutputFormat("regex" if key == "regex" else "lark", value if isinstance(value, str) else ""))
        except SpecdraftError as e:
            raise ValueError(str(e)) from None
    if len(asked) > 1:
        raise ValueError("ask for one output format: response_format or one structured_outputs field")
    if not asked:
        return None
    try:
        grammar.check(asked[0])
    except SpecdraftError as e:
        raise ValueError(str(e)) from None
    return asked[0]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls (server.tools)
    tool_call_id: str | None = None  # a tool's result: the call it answers
    name: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    logprobs: StrictBool | None = None  # each token's log-probability under the target
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)  # and its most likely, listed
    # tool calling (server.tools): the functions, whether / which to call, several calls an answer
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | dict | None = None
    parallel_tool_calls: StrictBool = True
    _calls: list[str] | str = PrivateAttr(default="none")

    @model_validator(mode="after")
    def _tool_calls(self):
        if self.tools:
            tools.check_tools(self.tools)
        self._calls = tools.forced_names(self.tool_choice, self.tools)
        if self._calls != "none" and self._output_format is not None:
            raise ValueError("ask for tool calls or an output format (response_format, structured_outputs), not both")
        if isinstance(self._calls, list):  # the answer is calls: their format must compile
            try:
                grammar.check(tools.call_format(self.tools, self._calls, self.parallel_tool_calls))
            except SpecdraftError as e:
                raise ValueError(f"a tool's parameters: {e}") from None
        return self

    def hold_to_calls(self, tag_tokens: bool) -> None:
        """Where tool_choice asks for calls ("required", or a function named): their format
        (tools.call_format; ``tag_tokens``: the tokenizer's own tokens for the tags) becomes the
        answer's output format."""
        if isinstance(self._calls, list):
            self._output_format = tools.call_format(self.tools, self._calls, self.parallel_tool_calls, tag_tokens)

    @property
    def calls_tools(self) -> bool:
        """The answer may call the request's tools (tools given, tool_choice not "none")."""
        return self._calls != "none"

    @property
    def template_tools(self) -> list[dict] | None:
        """The tools as the chat template takes them, where the answer may call them."""
        return tools.template_tools(self.tools) if self.calls_tools else None

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def logprob_count(self) -> int | None:
        """GenerationConfig.logprobs: None for none, else the most likely tokens listed beside each."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Common):
    # a text or token ids, or a list of them (a batch: a choice each, one after another)
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    # the prompt's text before the completion's (with logprobs: its tokens scored too, the first
    # without a score); with max_tokens 0 the prompt alone (how lm-evaluation-harness scores text)
    echo: StrictBool = False
    max_tokens: StrictInt | None = Field(default=None, ge=0)
    # the legacy form: each token's log-probability and this many most likely beside it
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: str | None = None  # refused when given (no fill-in-the-middle)
    tools: list | None = None  # refused when given (chat's)

    @field_validator("tools", "suffix")
    @classmethod
    def _refused(cls, v, info):
        if v:
            raise ValueError(f"{info.field_name} is not supported" + (" here (chat completions take tools)"
                                                                      if info.field_name == "tools" else ""))
        return v
    best_of: StrictInt | None = None  # refused past n (no choosing among answers)

    @model_validator(mode="after")
    def _best_of_is_n(self):
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported (every answer is returned)")
        return self

    @model_validator(mode="after")
    def _nothing_needs_echo(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens 0 generates nothing: give echo: true to score the prompt, or max_tokens >= 1")
        return self

    @property
    def logprob_count(self) -> int | None:
        return self.logprobs

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens if self.max_completion_tokens is None else self.max_completion_tokens

    @property
    def prompt_logprob_count(self) -> int | None:
        """GenerationConfig.prompt_logprobs: the prompt is scored when echoed with logprobs (or
        echoed alone, nothing generated: the engine then only prefills)."""
        if not self.echo:
            return None
        return self.logprobs if self.logprobs is not None else (0 if self.token_limit == 0 else None)

    @field_validator("prompt")
    @classmethod
    def _some_prompt(cls, v):
        if isinstance(v, list) and (not v or any(isinstance(x, list) and not x for x in v)):
            raise ValueError("the prompt is empty")
        return v

    @property
    def prompts(self) -> list[str | list[int]]:
        """The request's prompts, each a text or a list of token ids."""
        p = self.prompt
        return [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)


class TokenizeRequest(BaseModel):
    """POST /tokenize (vLLM's): a text, or chat messages through the template."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)  # messages: the functions the template lists
    add_special_tokens: StrictBool = True  # a text's (the template puts a chat's own)
    add_generation_prompt: StrictBool = True  # messages: end ready for the assistant's answer

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt (a text) or messages")
        return self


class DetokenizeRequest(BaseModel):
    """POST /detokenize (vLLM's): token ids back to text."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[StrictInt]
