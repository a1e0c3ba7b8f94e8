"""Structured output, timed: JSON answers to a schema, every method against plain decoding, with
and without the format's forced tokens as guesses (SpecConfig.format_guesses).

    python scripts/structured_bench.py [--rounds 2] [--style flexible|line] [--methods ...] [--temperature T]
        [--out FILE]

Eight extraction prompts, each with its JSON schema (no benchmark prompt among them), greedy,
up to 160 new tokens on the default target in its auto format. Methods run interleaved prompt by
prompt (``none`` first each time; the suffix drafters' history of earlier answers emptied
before each, as the bench does), every round; per method: summed new tokens over summed
seconds (prefill included), the same after each answer's first token against ``none``'s (decode),
tokens a target forward, and whether every text equals ``none``'s
(constrained plain decoding). ``--style line``: the schemas ask for one-line JSON with ", " and
": " separators (llguidance's ``x-guidance`` options), where the format forces more of the text;
``flexible`` (the default): any JSON whitespace, the model choosing it. ``--style tools``: eight
requests with six functions given to the chat template, each answer held to calls of them (the
server's tool_choice "required", server.tools); ``--reuse-prefix`` keeps what prompts share in the
target's cache, as ``specdraft serve`` does (the tools list then prefills once). ``--temperature T``:
sampled, each answer seeded by its prompt and round (the texts then differ by method; every one
the format ends must parse, or its calls be read).
"""
from __future__ import annotations

import argparse
import json
import time

from specdraft.config import GenerationConfig, OutputFormat, SamplingConfig, SpecConfig
from specdraft.drafters import needs_draft_model
from specdraft.drafters.suffix import HISTORY
from specdraft.pipeline import Speculator

S, I, B = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}


def obj(**props) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def arr(items) -> dict:
    return {"type": "array", "items": items}


TASKS = [
    ("Extract the person's details as JSON: Maria Lopez is a 34-year-old civil engineer from Seville who speaks "
     "Spanish, English and Portuguese and has worked at the same bank for six years.",
     obj(name=S, age=I, occupation=S, city=S, languages=arr(S), years_at_employer=I)),
    ("Summarise this review as JSON: 'The blender is powerful and easy to clean, but it is very loud and the lid "
     "cracked after two months. I would not buy it again.' Give a sentiment, a rating from 1 to 5, the pros and the "
     "cons.", obj(sentiment={"enum": ["positive", "negative", "mixed"]}, rating=I, pros=arr(S), cons=arr(S))),
    ("Turn these meeting notes into JSON: On March 3 Anna, Ben and Chloe met about the website launch. Anna will "
     "finish the copy by Friday, Ben will fix the checkout bug, and Chloe will book the photographer.",
     obj(date=S, topic=S, attendees=arr(S), action_items=arr(obj(owner=S, task=S)))),
    ("Give a recipe for pancakes as JSON with its name, the ingredients with their amounts, and the steps.",
     obj(name=S, servings=I, ingredients=arr(obj(item=S, amount=S)), steps=arr(S))),
    ("Describe this Python function as JSON: def merge_sorted(a: list[int], b: list[int]) -> list[int]: which "
     "merges two sorted lists into one sorted list.",
     obj(name=S, parameters=arr(obj(name=S, type=S)), returns=S, description=S)),
    ("Parse this address into JSON: Flat 4B, 221 Baker Street, London NW1 6XE, United Kingdom.",
     obj(unit=S, street_number=S, street=S, city=S, postcode=S, country=S)),
    ("List three European capitals with their countries and approximate populations in millions, as JSON.",
     obj(capitals=arr(obj(city=S, country=S, population_millions={"type": "number"})))),
    ("Classify this support ticket as JSON: 'I was charged twice for my subscription this month, please refund "
     "one of the payments.' Give the category, the urgency and whether a refund is requested.",
     obj(category={"enum": ["billing", "technical", "account", "other"]}, urgency={"enum": ["low", "medium", "high"]},
         refund_requested=B, summary=S)),
]


# --style tools: each request's answer held to calls of these functions (tool_choice "required",
# server.tools.call_format), the functions given to the chat template as the server does
def fn(name: str, description: str, **props) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": obj(**props)}}


TOOLS = [fn("get_weather", "Current weather in a city", city=S, unit={"enum": ["celsius", "fahrenheit"]}),
         fn("search_web", "Search the web", query=S),
         fn("send_email", "Send an email", to=S, subject=S, body=S),
         fn("create_event", "Add an event to the calendar", title=S, date=S, attendees=arr(S)),
         fn("convert_currency", "Convert an amount of money", amount={"type": "number"}, source=S, target=S),
         fn("get_stock_price", "The latest price of a stock", symbol=S)]
TOOL_TASKS = [
    "What's the weather like in Lisbon right now, in celsius?",
    "Email anna@example.com that the launch moves to Friday, with a short friendly subject line.",
    "Put a meeting called 'Budget review' on 2025-03-14 with Ben and Chloe.",
    "How much is 250 US dollars in euros?",
    "Find recent news about solid-state batteries.",
    "What are Apple and Microsoft trading at?",
    "Is it colder in Oslo or in Helsinki today? Use fahrenheit.",
    "Tell Ben (ben@example.com) that the report is ready and book a 'Report walkthrough' for 2025-04-02 with him.",
]


def _tasks(sd, style: str) -> list[tuple[list[int], OutputFormat]]:
    """(prompt ids, output format) per task of the style."""
    if style == "tools":
        from specdraft.server.tools import Tool, call_format, tags_are_tokens

        tools = [Tool.model_validate(t) for t in TOOLS]
        fmt = call_format(tools, [t.function.name for t in tools], parallel=True, tag_tokens=tags_are_tokens(sd.tokenizer))
        return [(sd.encode_messages([{"role": "user", "content": q}], TOOLS), fmt) for q in TOOL_TASKS]
    line = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "} if style == "line" else None
    return [(sd.encode_prompt(prompt), OutputFormat.schema({**schema, "x-guidance": line} if line else schema))
            for prompt, schema in TASKS]


def _parses(text: str, style: str) -> None:
    """An answer its format ended: JSON, or (tools) calls."""
    if style == "tools":
        from specdraft.server.tools import parse_calls

        if not parse_calls(text, {t["function"]["name"] for t in TOOLS})[1]:
            raise SystemExit(f"no call parsed out of {text!r}")
    else:
        json.loads(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--style", choices=["flexible", "line", "tools"], default="flexible")
    ap.add_argument("--methods", default="hybrid-head,fusion,prompt-lookup")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--out", default=None, help="also write the table here (markdown)")
    ap.add_argument("--reuse-prefix", action="store_true",
                    help="keep prompts' prefixes in the target's cache as the server does (a tools list prefilled once)")
    args = ap.parse_args()
    methods = args.methods.split(",")
    sd = Speculator(None, None, load_draft=any(needs_draft_model(m) for m in methods), reuse_prefix=args.reuse_prefix)
    runs = [("none", True)] + [(m, g) for m in methods for g in (True, False)]
    totals = {r: [0, 0.0, 0, 0, 0.0] for r in runs}  # tokens, seconds, forwards, texts unequal to none's, prefill seconds
    tasks = _tasks(sd, args.style)
    for rnd in range(args.rounds):
        for task, (prompt, fmt) in enumerate(tasks):
            sampling = SamplingConfig(temperature=args.temperature, seed=1000 * rnd + task)
            gen = GenerationConfig(max_new_tokens=args.max_new_tokens, output_format=fmt)
            texts = {}
            for method, guesses in runs:
                HISTORY.clear()  # (an earlier run's answer in the suffix drafters' history would give this one away)
                t0 = time.perf_counter()
                r = sd.generate(prompt, spec=SpecConfig(method=method, format_guesses=guesses), gen=gen, sampling=sampling)
                seconds = time.perf_counter() - t0
                texts[(method, guesses)] = r.text
                if r.stats.new_tokens < args.max_new_tokens:  # an answer the format ended parses
                    _parses(r.text, args.style)
                t = totals[(method, guesses)]
                t[0] += r.stats.new_tokens
                t[1] += seconds
                t[2] += r.stats.target_forwards
                t[4] += r.stats.time_prefill
                if r.text != texts[("none", True)]:
                    t[3] += 1
                    if args.temperature == 0:  # greedy: every method must give none's text; say where it did not
                        want = texts[("none", True)]
                        at = next((i for i, (x, y) in enumerate(zip(r.text, want)) if x != y), min(len(r.text), len(want)))
                        print(f"round {rnd}, task {task}, {method} (format guesses {guesses}) leaves none's text at "
                              f"character {at}: {r.text[max(0, at - 40):at + 20]!r} against {want[max(0, at - 40):at + 20]!r}",
                              flush=True)
    def decode_rate(t) -> float:  # the tokens after each answer's first over the seconds after its prefill
        return (t[0] - args.rounds * len(tasks)) / (t[1] - t[4])

    base = totals[("none", True)][0] / totals[("none", True)][1]
    base_decode = decode_rate(totals[("none", True)])
    lines = ["| method | format guesses | tok/s | vs none | decode vs none | tokens a forward | texts equal to none's |",
             "|---|---|---:|---:|---:|---:|---|"]
    for (method, guesses), t in totals.items():
        tokens, seconds, forwards, unequal = t[:4]
        rate = tokens / seconds
        lines.append(f"| {method} | {'-' if method == 'none' else ('on' if guesses else 'off')} | {rate:.1f} | "
                     f"{rate / base:.2f}x | {decode_rate(t) / base_decode:.2f}x | {tokens / forwards:.2f} | "
                     f"{'- (sampled)' if args.temperature > 0 else 'all' if not unequal else f'{unequal} differ'} |")
    table = "\n".join(lines)
    print(f"{len(tasks)} prompts x {args.rounds} rounds, style {args.style}, {args.max_new_tokens} new tokens at most, "
          f"temperature {args.temperature}\n")
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
