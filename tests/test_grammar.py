"""Structured output (config.OutputFormat, specdraft.grammar) on a tiny model with a byte-level
tokenizer: every answer keeps its format, speculation leaves it the answer constrained plain
decoding gives, the format's forced tokens and pruning keep the drafter's node numbers, and a
sampled answer keeps the target's distribution over what the format allows."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch

from _tiny import make_cli_model, tiny_client
from specdraft import grammar
from specdraft.config import GenerationConfig, OutputFormat, SamplingConfig, SpecConfig
from specdraft.drafters.base import Draft
from specdraft.errors import ParameterError
from specdraft.pipeline import Speculator
from specdraft.policy import Sent

PROMPT = "abcabcabd abcab"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "c": {"enum": ["red", "green"]}},
          "required": ["ok", "n", "c"], "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}
FORMATS = {
    "schema": OutputFormat.schema(SCHEMA),
    "regex": OutputFormat("regex", "[a-z]{3}-[0-9]{2}"),
    "choice": OutputFormat.choices(["alpha", "beta", "gamma"]),
    "lark": OutputFormat("lark", 'start: "value=" NUM ";" WORD\nNUM: /[0-9]+/\nWORD: /[a-z]{4}/'),
}


def keeps(fmt: OutputFormat, text: str) -> bool:
    if fmt.kind == "json_schema":
        value = json.loads(text)
        return set(value) == {"ok", "n", "c"} and isinstance(value["ok"], bool) and 0 <= value["n"] <= 99 \
            and value["c"] in ("red", "green")
    if fmt.kind == "regex":
        return re.fullmatch(fmt.spec, text) is not None
    if fmt.kind == "choice":
        return text in json.loads(fmt.spec)
    return re.fullmatch(r"value=[0-9]+;[a-z]{4}", text) is not None


@pytest.fixture(scope="module")
def sd(tmp_path_factory):
    d = make_cli_model(tmp_path_factory.mktemp("grammar") / "tiny", byte_level=True)
    return Speculator(str(d), str(d), dtype="fp32", draft_format="w8a8", target_format="w8a8", max_length=256,
                      progress=False)


def answer(sd, fmt, method="none", sampling=SamplingConfig(), max_new_tokens=60, **spec_kw):
    spec = SpecConfig(method=method, k=4, ngram_min=1, min_confidence=0.0, **spec_kw)
    return sd.generate(PROMPT, spec=spec, sampling=sampling, chat=False,
                       gen=GenerationConfig(max_new_tokens=max_new_tokens, output_format=fmt))


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("method, spec_kw", [
    ("draft-model", {"cost_rule": False, "trees": False}), ("draft-model", {"cost_rule": False, "trees": True}),
    ("prompt-lookup", {"cost_rule": False}), ("draft-model", {"cost_rule": False, "format_guesses": False})])
def test_constrained_answers_keep_the_format_and_equal_plain(sd, name, method, spec_kw):
    fmt = FORMATS[name]
    plain = answer(sd, fmt)
    assert keeps(fmt, plain.text), plain.text
    assert plain.stats.new_tokens < 60  # the format ended it, before the token limit
    res = answer(sd, fmt, method, **spec_kw)
    assert res.token_ids == plain.token_ids and res.text == plain.text
    assert res.stats.drafts > 0


def test_log_probabilities_under_a_format_are_plain_decodings(sd):
    """Speculation under a format reports constrained plain decoding's log-probabilities (the raw
    softmax of the rows that chose the tokens), as it does without one."""
    def scored(method, **kw):
        spec = SpecConfig(method=method, k=4, ngram_min=1, min_confidence=0.0, cost_rule=False, **kw)
        return sd.generate(PROMPT, spec=spec, chat=False, gen=GenerationConfig(max_new_tokens=60, logprobs=2,
                                                                               output_format=FORMATS["schema"]))
    plain = scored("none")
    for trees in (False, True):
        res = scored("draft-model", trees=trees)
        assert res.token_ids == plain.token_ids and res.stats.accepted_tokens > 0
        assert res.logprobs == pytest.approx(plain.logprobs, abs=1e-5)
        assert [[i for i, _ in t] for t in res.top_logprobs] == [[i for i, _ in t] for t in plain.top_logprobs]


def test_the_format_changes_the_answer_and_free_text_is_untouched(sd):
    free = answer(sd, None)
    assert not keeps(FORMATS["regex"], free.text)  # (the tiny model's own text is no such thing)
    assert answer(sd, None, "draft-model", cost_rule=False).token_ids == free.token_ids


def test_forced_tokens_are_sent_as_guesses(sd):
    """The schema forces its keys and punctuation: with format guesses, prompt lookup (which finds
    little here) commits more tokens a forward than without, the same answer."""
    fmt = FORMATS["schema"]
    on = answer(sd, fmt, "prompt-lookup", cost_rule=False)
    off = answer(sd, fmt, "prompt-lookup", cost_rule=False, format_guesses=False)
    assert on.token_ids == off.token_ids
    assert on.stats.mean_accepted_tokens > off.stats.mean_accepted_tokens


@pytest.mark.parametrize("method", ["draft-model", "prompt-lookup"])
def test_sampled_constrained_answers_keep_the_format_and_their_seed(sd, method):
    for seed in range(6):
        sampling = SamplingConfig(temperature=1.0, seed=seed)
        res = answer(sd, FORMATS["regex"], method, sampling, cost_rule=False)
        assert keeps(FORMATS["regex"], res.text), res.text
        assert answer(sd, FORMATS["regex"], method, sampling, cost_rule=False).text == res.text


def test_choices_are_taken_literally(sd):
    """Choices holding what a regex would read as syntax (angle brackets: word boundaries in
    llguidance's regexes; quotes, bars, brackets) are matched as the texts they are."""
    options = ['a<b', 'c>d', 'x|y', '"q"', '(z)', 'back\\', 'a.b']
    fmt = OutputFormat.choices(options)
    grammar.check(fmt)
    assert answer(sd, fmt).text in options
    for text in options:
        c = grammar.Constraint(fmt, sd.tokenizer, sd.target.model.vocab_size, sd.target.eos_ids)
        ids = sd.tokenizer.encode(text, add_special_tokens=False)
        c.commit(ids)
        assert c.matcher.is_accepting(), text


def test_speculative_sampling_keeps_the_targets_distribution_over_the_choices(sd):
    """Answers to a choice format sampled with draft-model (sampled guesses, each judged against
    the masked target) against plain sampled decoding: a two-sample chi-square over the choices."""
    from scipy.stats import chi2_contingency

    fmt = OutputFormat.choices(["ab", "ac", "b", "ba"])
    n = 300
    counts = {}
    for method in ("none", "draft-model"):
        got = Counter(answer(sd, fmt, method, SamplingConfig(temperature=1.0, seed=1000 + i), cost_rule=False).text
                      for i in range(n))
        counts[method] = got
    names = sorted(set(counts["none"]) | set(counts["draft-model"]))
    assert set(names) <= {"ab", "ac", "b", "ba"} and len(names) >= 2
    table = [[counts[m][c] for c in names] for m in ("none", "draft-model")]
    assert chi2_contingency(table).pvalue > 0.001, table


def test_prune_drops_what_the_format_rules_out_and_keeps_node_numbers(sd):
    tok = sd.tokenizer
    ids = {ch: tok.convert_tokens_to_ids(ch) for ch in "abc-1"}
    c = grammar.Constraint(OutputFormat("regex", "ab-[0-9]"), tok, sd.target.model.vocab_size, sd.target.eos_ids)
    chain = Draft([ids["a"], ids["b"], ids["c"], ids["-"]])
    kept, nodes = c.prune(chain)
    assert kept.tokens == [ids["a"], ids["b"]] and nodes == [0, 1]
    # a tree: a -> (b -> -, c), b: "b" and "ac" are ruled out (and what hangs under them)
    tree = Draft([ids["a"], ids["b"], ids["b"], ids["c"], ids["-"]], parents=[-1, -1, 0, 0, 2],
                 chances=[0.9, 0.5, 0.8, 0.3, 0.7])
    kept, nodes = c.prune(tree)
    assert nodes == [0, 2, 4] and kept.tokens == [ids["a"], ids["b"], ids["-"]] and kept.parents is not None
    assert kept.parents == [-1, 0, 1] and kept.chances == [0.9, 0.8, 0.7]
    masks = c.masks(kept)  # row 0: "a" only; after "a": "b"; after "ab": "-"; after "ab-": digits
    assert masks[0].nonzero().flatten().tolist() == [ids["a"]]
    assert masks[1].nonzero().flatten().tolist() == [ids["b"]]
    assert masks[2].nonzero().flatten().tolist() == [ids["-"]]
    assert ids["1"] in masks[3].nonzero().flatten().tolist() and int(masks[3].sum()) == 10
    c.commit([ids["a"]])
    assert c.forced() == [ids["b"], ids["-"]]
    with pytest.raises(ParameterError, match="parser stopped"):
        c.commit([ids["c"]])


def test_fit_merges_forced_tokens_and_leaves_sampled_proposals_whole(sd):
    tok = sd.tokenizer
    ids = {ch: tok.convert_tokens_to_ids(ch) for ch in "abc-1"}
    c = grammar.Constraint(OutputFormat("regex", "ab-[0-9]"), tok, sd.target.model.vocab_size, sd.target.eos_ids)

    def keep_all(d):
        return Sent(d, list(range(len(d))), len(d))

    # the drafter guessed "a", "c" and "a", "b", "-", "1": the format drops "c", forces "a b -"
    proposal = Draft([ids["a"], ids["c"], ids["b"], ids["-"], ids["1"]], parents=[-1, 0, 0, 2, 3],
                     chances=[0.5, 0.4, 0.3, 0.2, 0.1])
    sent = c.fit(proposal, keep_all, c.forced())
    assert sent.draft.tokens == [ids["a"], ids["b"], ids["-"], ids["1"]] and sent.draft.parents is None
    assert sent.nodes == [0, 2, 3, 4] and sent.proposed == 5
    assert sent.draft.chances[:3] == [1.0, 1.0, 1.0]
    # forced tokens the drafter did not guess are numbered -1 (no drafter learns from them)
    sent = c.fit(Draft([ids["a"]], chances=[0.5]), keep_all, c.forced())
    assert sent.draft.tokens == [ids["a"], ids["b"], ids["-"]] and sent.nodes == [0, -1, -1]
    # a sampled proposal (its draws judged by min(1, p/q) and the residual) goes whole, unmerged
    q = torch.full((2, sd.target.model.vocab_size), 1.0 / sd.target.model.vocab_size)
    sampled = Draft([ids["c"], ids["a"]], probs=q)
    sent = c.fit(sampled, keep_all, c.forced())
    assert sent.draft is sampled and sent.nodes == [0, 1]


@pytest.mark.parametrize("fmt, message", [
    (OutputFormat("regex", "[0-9]+("), "does not compile"),
    (OutputFormat("json_schema", "{not json"), "not JSON"),
    (OutputFormat("json_schema", "[1, 2]"), "JSON object"),
    (OutputFormat("json_schema", '{"type": "nonsense"}'), "does not compile"),
    (OutputFormat("choice", "[]"), "non-empty list"),
    (OutputFormat("lark", "start: undefined_rule"), "does not compile"),
])
def test_bad_formats_are_one_line_errors(fmt, message):
    with pytest.raises(ParameterError, match=message) as e:
        grammar.check(fmt)
    assert "\n" not in str(e.value)


def test_output_format_fields_are_checked():
    with pytest.raises(ParameterError, match="one of"):
        OutputFormat("yaml", "x")
    with pytest.raises(ParameterError, match="pattern"):
        OutputFormat("regex", "")
    with pytest.raises(ParameterError, match="OutputFormat"):
        GenerationConfig(output_format="json")


def test_a_tokenizer_llguidance_cannot_read_is_a_one_line_error(tmp_path):
    d = make_cli_model(tmp_path / "fuse")  # a Fuse decoder: neither byte-level nor byte-fallback
    sd = Speculator(str(d), None, dtype="fp32", target_format="w8a8", load_draft=False, max_length=128, progress=False)
    with pytest.raises(ParameterError, match="tokenizer"):
        answer(sd, FORMATS["regex"])


# ------------------------------------------------------------------------------------ the server
@pytest.fixture(scope="module")
def api(sd):
    with tiny_client(sd, request_timeout=30) as c:
        yield c


def chat(api, **fields):
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 60, "temperature": 0, **fields}
    return api.post("/v1/chat/completions", json=body)


@pytest.mark.parametrize("fields, name", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}}, "schema"),
    ({"structured_outputs": {"regex": FORMATS["regex"].spec}}, "regex"),
    ({"guided_regex": FORMATS["regex"].spec, "method": "prompt-lookup"}, "regex"),
    ({"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}}, "choice"),
    ({"guided_choice": ["alpha", "beta", "gamma"], "stream": True}, "choice"),
    ({"structured_outputs": {"grammar": FORMATS["lark"].spec}, "n": 2, "temperature": 0.8, "seed": 3}, "lark"),
])
def test_the_server_answers_in_the_format_asked_for(api, sd, fields, name):
    r = chat(api, **fields)
    assert r.status_code == 200, r.text
    if fields.get("stream"):
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        texts = ["".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])]
    else:
        texts = [c["message"]["content"] for c in r.json()["choices"]]
        assert all(c["finish_reason"] == "stop" for c in r.json()["choices"])
    assert all(keeps(FORMATS[name], t) for t in texts), texts
    if fields.get("temperature", 0) == 0:  # greedy: constrained plain decoding's answer
        ids = sd.encode_messages([{"role": "user", "content": PROMPT}])
        want = sd.generate(ids, spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=60,
                                                                                       output_format=FORMATS[name]))
        assert texts == [want.text]


@pytest.mark.parametrize("fields, says", [
    ({"response_format": {"type": "json_schema"}}, "json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "json_object or json_schema"),
    ({"structured_outputs": {"regex": "[0-9]+("}}, "does not compile"),
    ({"structured_outputs": {"yaml": "a: 1"}}, "json, regex, choice or grammar"),
    ({"guided_json": "{not json"}, "not JSON"),
    ({"guided_choice": []}, "non-empty list"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "one output format"),
])
def test_bad_formats_are_400s(api, fields, says):
    r = chat(api, **fields)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_constrained_answers_decoded_together_are_each_prompts_own(tmp_path):
    """On the native runtime (q4k) answers under a format decoded together (specdraft.batch) are
    each the answer its prompt gets alone, greedy and sampled with its seed."""
    d = make_cli_model(tmp_path / "tiny", byte_level=True)
    sd = Speculator(str(d), dtype="fp32", target_format="q4k", max_length=256, load_draft=False, progress=False)
    assert sd.why_not_batched(SpecConfig(method="prompt-lookup")) is None
    prompts = [sd.encode_prompt(p, chat=False) for p in ("abcabcabd abcab", "hello hello hel", "xyz")]
    spec = SpecConfig(method="prompt-lookup", k=4, ngram_min=1, cost_rule=False)
    for fmt in (FORMATS["schema"], FORMATS["lark"]):
        gen = GenerationConfig(max_new_tokens=60, output_format=fmt)
        for samplings in ([SamplingConfig()] * 3, [SamplingConfig(temperature=0.8, seed=9 + i) for i in range(3)]):
            together = sd.generate_batch(prompts, spec=spec, samplings=samplings, gen=gen)
            for ids, sampling, res in zip(prompts, samplings, together, strict=True):
                alone = sd.generate(ids, spec=spec, sampling=sampling, gen=gen)
                assert res.token_ids == alone.token_ids and keeps(fmt, res.text), res.text


def test_nothing_after_an_end_of_sequence_token_counts(sd):
    """A guess after an end-of-sequence guess is dropped, a row after one allows everything (it is
    never reached), and a verdict's tokens after one are not the answer's (the format takes the
    end and stops)."""
    tok = sd.tokenizer
    ids = {ch: tok.convert_tokens_to_ids(ch) for ch in "ab"}
    eos = min(sd.target.eos_ids)
    # complete after "ab" but not stopped: an end may come, or digits
    c = grammar.Constraint(OutputFormat("regex", "ab[0-9]*"), tok, sd.target.model.vocab_size, sd.target.eos_ids)
    c.commit([ids["a"], ids["b"]])
    kept, nodes = c.prune(Draft([eos, ids["a"], ids["b"]]))
    assert kept.tokens == [eos] and nodes == [0]
    tree = Draft([eos, ids["a"], ids["b"]], parents=[-1, 0, -1])
    assert c.prune(tree)[1] == [0]
    masks = c.masks(Draft([eos, ids["a"]]))
    assert eos in masks[0].nonzero().flatten().tolist() and bool(masks[1].all()) and bool(masks[2].all())
    c.commit([eos, ids["a"]])
    assert c.stopped


@pytest.mark.parametrize("trees", [False, True])
def test_the_draft_model_guesses_what_the_format_allows(sd, monkeypatch, trees):
    """With format guesses the draft model guesses only what the format allows after each branch:
    a chain holds nothing for the engine to drop, a tree only children it rated 0 (a node with
    fewer allowed tokens than children); without, the format drops rated guesses."""
    dropped = []  # (chain?, chance of each dropped node)
    prune = grammar.Constraint.prune

    def counting(self, draft):
        kept, nodes = prune(self, draft)
        gone = sorted(set(range(len(draft))) - set(nodes))
        dropped.extend((draft.parents is None, None if draft.chances is None else draft.chances[j]) for j in gone)
        return kept, nodes

    monkeypatch.setattr(grammar.Constraint, "prune", counting)
    for guesses in (True, False):
        dropped.clear()
        res = answer(sd, FORMATS["schema"], "draft-model", cost_rule=False, trees=trees, format_guesses=guesses)
        assert keeps(FORMATS["schema"], res.text)
        if guesses:
            assert all(not chain and chance == 0.0 for chain, chance in dropped), dropped
        else:
            assert any(chain or chance > 0.0 for chain, chance in dropped)
