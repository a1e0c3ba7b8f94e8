"""lm-evaluation-harness's OpenAI-completions client against a running `specdraft serve`: its
loglikelihood (echo + logprobs + token ids), rolling loglikelihood and generate_until requests,
the loglikelihoods then checked against the library's own prompt scoring. Two steps, since
lm_eval and its dependencies are best kept in a venv of their own (only its client runs there):

    specdraft serve --port 8000 &
    python3 -m venv /tmp/lmeval && /tmp/lmeval/bin/pip install "lm_eval[api]" transformers
    /tmp/lmeval/bin/python scripts/lm_eval_check.py client --json /tmp/lm_eval.json
    python scripts/lm_eval_check.py library --json /tmp/lm_eval.json     # in specdraft's venv

The client tokenizes through the server (its /tokenize, /detokenize, /tokenizer_info, which lm_eval
finds by itself), or with ``--tokenizer DIR`` from the model's tokenizer directory. The library
step exits 1 when a loglikelihood differs from the client's.
"""
from __future__ import annotations

import argparse
import json
import sys

PAIRS = [("The capital of France is", " Paris"), ("The capital of France is", " Berlin"),
         ("def add(a, b):\n    return", " a + b"), ("2 + 2 =", " 4")]


def client(args) -> int:
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    tokenizer = {"tokenizer_backend": "huggingface", "tokenizer": args.tokenizer} if args.tokenizer else {}
    lm = LocalCompletionsAPI(base_url=args.url, model=args.target, tokenized_requests=True,
                             batch_size=args.batch_size, max_retries=1, **tokenizer)
    print(f"tokenizer: {type(lm.tokenizer).__name__}")
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(PAIRS)])
    rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("The quick brown fox jumps.",), 0)])
    text = lm.generate_until([Instance("generate_until", {}, ("def fib(n):", {"until": ["\n\n"], "max_gen_toks": 40}), 0)])
    for (ctx, cont), (ll, greedy) in zip(PAIRS, got):
        print(f"{ctx!r} + {cont!r}: loglikelihood {ll:.6f}, greedy {greedy}")
    print(f"rolling loglikelihood {rolling[0]:.6f}; generate_until {text[0]!r}")
    with open(args.json, "w") as f:
        json.dump({"target": args.target, "loglikelihoods": [ll for ll, _ in got]}, f)
    return 0


def library(args) -> int:
    from specdraft.config import GenerationConfig, SpecConfig
    from specdraft.pipeline import Speculator

    with open(args.json) as f:
        record = json.load(f)
    sd = Speculator(record["target"], progress=False, load_draft=False)
    want = []
    for ctx, cont in PAIRS:
        n = len(sd.tokenizer.encode(ctx, add_special_tokens=False))
        ids = sd.tokenizer.encode(ctx + cont, add_special_tokens=False)
        r = sd.generate(ids, spec=SpecConfig(method="none"), gen=GenerationConfig(max_new_tokens=0, prompt_logprobs=0))
        want.append(sum(r.prompt_logprobs[n - 1:]))  # prompt_logprobs[i] scores token i + 1
    same = [a == b for a, b in zip(record["loglikelihoods"], want, strict=True)]
    print(f"the library's loglikelihoods: {', '.join(f'{w:.6f}' for w in want)}; the client's equal: {all(same)}")
    return 0 if all(same) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("client", "library"))
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1/completions")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b", help="the served model's name")
    ap.add_argument("--tokenizer", help="client: the served model's tokenizer directory (default: the server's)")
    ap.add_argument("--batch-size", type=int, default=4, help="client: prompts a request (a batch: choices in order)")
    ap.add_argument("--json", default="lm_eval_check.json", help="the client's loglikelihoods, for the library step")
    args = ap.parse_args()
    return client(args) if args.step == "client" else library(args)


if __name__ == "__main__":
    sys.exit(main())
