"""The command line: ``specdraft generate``, ``bench``, ``serve``, ``train-head``, ``models``.

User errors print one line (``error: ...``) and exit with status 2; no traceback.
"""
from __future__ import annotations

import argparse
import os
import sys

from .config import GenerationConfig, SamplingConfig, SpecConfig
from .errors import SpecdraftError

_DEFAULTS_SPEC = SpecConfig()
_DEFAULTS_GEN = GenerationConfig()
_DEFAULTS_SAMPLING = SamplingConfig()
_DTYPES = ["auto", "bf16", "fp32"]
_FORMATS = ["auto", "dense", "int8", "int4", "w8a8", "w8a8-fast", "gguf", "q4k"]  # "auto" + models.quant.WEIGHT_FORMATS


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="target model: packaged name, HF model dir or .gguf (default: qwen2.5-coder-1.5b)")
    p.add_argument("--draft", default=None, help="draft model for --method draft-model (default: qwen2.5-coder-0.5b)")
    p.add_argument("--dtype", default="auto", choices=_DTYPES,
                   help="weights and activations of the models; auto = bf16 on CPUs with native bf16 (AMX), else fp32")
    p.add_argument("--target-format", default=None, choices=_FORMATS,
                   help="target weights: auto = gguf (the GGUF file's own Q4_K/Q6_K weights, native kernels) or else "
                        "w8a8 (int8 weights and activations) on CPUs without native bf16, dense bf16 on AMX; "
                        "dense = exact --dtype weights")
    p.add_argument("--draft-format", default=None, choices=_FORMATS,
                   help="draft model weights (auto = q4k: its weights quantized to Q4_K on load for the native kernels, "
                        "where they build; else w8a8-fast, or int4 on AMX); a draft's numerics never change the output")
    p.add_argument("--runtime", default="auto", choices=["auto", "native", "hf"], help="native Llama-family runtime or the transformers adapter")
    p.add_argument("--max-context", type=int, default=4096, help="KV cache capacity in tokens")


def _spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k", type=int, default=_DEFAULTS_SPEC.k, help="draft tokens per target forward (default: the drafter's own, see config.DEFAULT_K)")
    p.add_argument("--min-confidence", type=float, default=_DEFAULTS_SPEC.min_confidence,
                   help="draft-model, greedy: draft another token only while the product of the draft's "
                        "probabilities for its guesses so far is at least this")
    p.add_argument("--ngram-max", type=int, default=_DEFAULTS_SPEC.ngram_max, help="prompt-lookup: longest n-gram matched")
    p.add_argument("--ngram-min", type=int, default=_DEFAULTS_SPEC.ngram_min, help="prompt-lookup: shortest n-gram matched")
    p.add_argument("--draft-window", type=int, default=_DEFAULTS_SPEC.draft_window,
                   help="draft model: see at most this many (latest) prompt tokens, bounding its prefill; "
                        "0 = all (default: 256 for hybrid, all for draft-model)")
    p.add_argument("--head", default=_DEFAULTS_SPEC.head,
                   help="head / hybrid-head: directory of a trained drafting head (default: the one shipped for the target)")


def spec_from_args(method: str, args) -> SpecConfig:
    """The SpecConfig that _spec_args' options describe (ParameterError when one is invalid)."""
    return SpecConfig(method=method, k=args.k, ngram_max=args.ngram_max, ngram_min=args.ngram_min,
                      min_confidence=args.min_confidence, draft_window=args.draft_window,
                      head=args.head)


def speculator_options(args) -> dict:
    """Options of Speculator that the command line sets only when given."""
    opts = {"draft_format": args.draft_format, "target_format": args.target_format}
    return {k: v for k, v in opts.items() if v}


def _methods() -> list[str]:
    from .drafters import drafter_names

    return ["none"] + drafter_names()


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (no usage block) and exits with 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specdraft", description="Lossless speculative decoding, CPU first.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text for a prompt, streaming, then print statistics")
    g.add_argument("prompt")
    g.add_argument("--method", default=None, choices=_methods(),
                   help="the drafter; none = plain decoding (default: hybrid-head where a head is shipped for the "
                        "target, else draft-model)")
    _model_args(g)
    _spec_args(g)
    g.add_argument("--temperature", type=float, default=_DEFAULTS_SAMPLING.temperature, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=_DEFAULTS_SAMPLING.top_k)
    g.add_argument("--top-p", type=float, default=_DEFAULTS_SAMPLING.top_p)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--max-new-tokens", type=int, default=_DEFAULTS_GEN.max_new_tokens)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    g.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                   help="colour tokens by origin: green = accepted draft, blue = produced by the target")
    g.add_argument("--json", action="store_true", help="print the statistics as JSON instead of one line")

    v = sub.add_parser("serve", help="serve an OpenAI-compatible API (and a chat page at /)")
    v.add_argument("--method", default=None, choices=_methods(),
                   help="default drafter; a request may pick another with the extension field \"method\"")
    _model_args(v)
    _spec_args(v)
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--model-name", default=None, help="the model id clients send (default: the target's name)")
    v.add_argument("--queue-size", type=int, default=16, help="requests that may wait; the next one gets 429")
    v.add_argument("--request-timeout", type=float, default=300.0, help="seconds from arrival to a forced end")
    v.add_argument("--max-body-bytes", type=int, default=1 << 20)
    v.add_argument("--no-draft", action="store_true", help="do not load a draft model (only none / prompt-lookup)")

    b = sub.add_parser("bench", help="benchmark methods on Spec-Bench prompts")
    from .bench.harness import add_bench_args

    add_bench_args(b)
    _model_args(b)
    _spec_args(b)

    t = sub.add_parser("train-head", help="train a drafting head on the target's features (for --method head / hybrid-head)")
    from .heads.train import add_train_args

    add_train_args(t)
    _model_args(t)

    c = sub.add_parser("calibrate", help="measure a model's forward cost over 1..32 new tokens on this machine")
    c.add_argument("--model", default=None, help="packaged name, HF model dir or .gguf (default: the default target)")
    c.add_argument("--format", default="auto", choices=_FORMATS,
                   help="weight format (auto = what a target gets on this CPU)")
    c.add_argument("--dtype", default="auto", choices=_DTYPES)
    c.add_argument("--context", type=int, default=300, help="tokens already in the KV cache")
    c.add_argument("--blocks", default="1,2,4,8,16,32", help="comma-separated numbers of new tokens")
    c.add_argument("--repeats", type=int, default=5, help="timed forwards per block (median reported)")
    c.add_argument("--json", dest="json_out", default=None, help="also write {tokens, seconds, ...} here")

    m = sub.add_parser("models", help="list the packaged models, or prepare (join, verify, convert) them")
    m.add_argument("action", choices=["list", "prepare"])
    m.add_argument("names", nargs="*")
    return parser


def default_method(args) -> str:
    """--method when given, else the best measured method the target allows: hybrid-head where a
    head is shipped for it (1.21x against hybrid's 1.14x on the dev prompts, and no draft model
    to load), else draft-model."""
    from .heads.model import shipped_head_dir
    from .models.packaged import DEFAULT_TARGET

    if args.method:
        return args.method
    if args.head or shipped_head_dir(args.target or DEFAULT_TARGET):
        return "hybrid-head"
    return _DEFAULTS_SPEC.method


def _cmd_generate(args) -> int:
    from .pipeline import Speculator
    from .drafters import needs_draft_model

    args.method = default_method(args)
    # Validate cheap things before loading any model.
    spec = spec_from_args(args.method, args)
    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, stop=tuple(args.stop))
    with_draft = args.method != "none" and needs_draft_model(args.method)
    sd = Speculator(args.target, args.draft, dtype=args.dtype, runtime=args.runtime, max_length=args.max_context,
                    load_draft=with_draft, **speculator_options(args))
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    engine = sd.engine(spec)
    ids = sd.encode_prompt(args.prompt, chat=not args.no_chat)
    out = sys.stdout
    for piece in engine.stream(ids, sampling, gen):
        if color and piece.text:
            code = "32" if piece.origin == "draft" else "34"
            out.write(f"\x1b[{code}m{piece.text}\x1b[0m")
        else:
            out.write(piece.text)
        out.flush()
    out.write("\n")
    if args.json:
        import json

        print(json.dumps(engine.stats.to_dict()))
    else:
        print(engine.stats.summary())
    return 0


def _cmd_serve(args) -> int:
    from .errors import ParameterError
    from .pipeline import Speculator
    from .drafters import needs_draft_model

    args.method = default_method(args)
    spec = spec_from_args(args.method, args)
    if args.queue_size < 1 or args.request_timeout <= 0 or args.max_body_bytes < 1024 or not 0 < args.port < 65536:
        raise ParameterError("queue-size must be >= 1, request-timeout > 0, max-body-bytes >= 1024, port in 1..65535")
    with_draft = not args.no_draft
    if not with_draft and args.method != "none" and needs_draft_model(args.method):
        raise ParameterError(f"--method {args.method} needs the draft model; drop --no-draft or pick none/prompt-lookup")
    import uvicorn

    from .server.app import ServerConfig, create_app

    sd = Speculator(args.target, args.draft, dtype=args.dtype, runtime=args.runtime, max_length=args.max_context,
                    load_draft=with_draft, **speculator_options(args))
    config = ServerConfig(model_name=args.model_name or sd.target.name, spec=spec, max_waiting=args.queue_size,
                          request_timeout=args.request_timeout, max_body_bytes=args.max_body_bytes)
    print(f"serving {config.model_name} on http://{args.host}:{args.port} (method {spec.method}; chat page at /)",
          file=sys.stderr)
    uvicorn.run(create_app(sd, config), host=args.host, port=args.port, log_level="warning")
    return 0


def _cmd_calibrate(args) -> int:
    import json

    import torch

    from .bench.forward_cost import forward_cost
    from .errors import ParameterError
    from .kernels import kernel_path_note
    from .models.packaged import DEFAULT_TARGET
    from .pipeline import load_model

    try:
        blocks = tuple(int(b) for b in args.blocks.split(","))
    except ValueError:
        raise ParameterError(f"--blocks must be comma-separated integers, got {args.blocks!r}") from None
    if not blocks or min(blocks) < 1 or args.context < 1 or args.repeats < 1:
        raise ParameterError("blocks, context and repeats must be >= 1")
    name = args.model or DEFAULT_TARGET
    m = load_model(name, dtype=args.dtype, weight_format=args.format, max_length=args.context + max(blocks) + 1)
    cost = forward_cost(m.model, blocks=blocks, context=args.context, repeats=args.repeats)
    one = cost["seconds"][0]
    print(f"GGUF kernel path: {kernel_path_note()}")
    for k, sec in zip(cost["tokens"], cost["seconds"]):
        print(f"{k:3d} new tokens: {sec * 1000:8.1f} ms  ({sec / one:.2f}x the first block, {k / sec:7.1f} tok/s)")
    if args.json_out:
        report = {"model": name, "weight_format": getattr(m.model, "weight_format", "hf"),
                  "dtype": str(getattr(m.model, "dtype", "")), "context": args.context,
                  "threads": torch.get_num_threads(), **cost}
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return 0


def _cmd_models(args) -> int:
    from .models.packaged import PACKAGED, resolve_model_dir

    if args.action == "list":
        for name, pm in PACKAGED.items():
            print(f"{name:22s} {pm.description}")
        return 0
    for name in args.names or list(PACKAGED):
        print(f"{name}: {resolve_model_dir(name)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            return _cmd_generate(args)
        if args.command == "bench":
            from .bench.harness import run_bench

            return run_bench(args)
        if args.command == "serve":
            return _cmd_serve(args)
        if args.command == "models":
            return _cmd_models(args)
        if args.command == "calibrate":
            return _cmd_calibrate(args)
        if args.command == "train-head":
            from .heads.train import train_from_args

            return train_from_args(args)
    except SpecdraftError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
