"""``specdraft index build`` and ``specdraft index info``: the command-line entry for retrieval
indexes. A top-layer entry point beside the CLI; nothing below it imports this module."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import ModelFileError
from ..models.packaged import DEFAULT_TARGET, resolve_model_dir
from .build import DEFAULT_GLOBS, DEFAULT_MAX_TOKENS, BuildConfig, build_index
from .datastore import FILES, Datastore


def add_index_args(p) -> None:
    """The ``index`` subcommands and their options (their parsers are of p's class)."""
    sub = p.add_subparsers(dest="action", required=True, parser_class=type(p))
    b = sub.add_parser("build", help="tokenize text files with the target's tokenizer into a datastore for "
                                     "--method retrieval")
    b.set_defaults(func=build_from_args)
    b.add_argument("paths", nargs="+", metavar="PATH", help="files and directories to index")
    b.add_argument("-o", "--out", required=True, metavar="INDEX", help="the index directory to write")
    b.add_argument("--target", default=None,
                   help=f"the target whose tokenizer the index uses: packaged name, HF model dir or .gguf "
                        f"(default: {DEFAULT_TARGET}); generate refuses the index with another target")
    b.add_argument("--glob", default=",".join(DEFAULT_GLOBS),
                   help="comma-separated file name patterns read from directories (files named directly are "
                        "always read)")
    b.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help="stop once this many tokens are indexed (the index takes 8 bytes a token)")
    i = sub.add_parser("info", help="print an index's header and size")
    i.set_defaults(func=info_from_args)
    i.add_argument("index", metavar="INDEX")


def build_from_args(args) -> int:
    config = BuildConfig(tuple(args.paths), tuple(g.strip() for g in args.glob.split(",")), args.max_tokens)
    target = args.target or DEFAULT_TARGET
    tokenizer_json = resolve_model_dir(target, weights=False) / "tokenizer.json"
    if not tokenizer_json.is_file():
        raise ModelFileError(f"target {target!r} has no tokenizer.json, which an index is tokenized with; "
                             "pass a target that has one")
    out = Path(args.out).expanduser()
    built = build_index(config, out, tokenizer_json, target)
    notes = [f"{built.skipped} skipped: empty or not UTF-8 text"] if built.skipped else []
    notes += [f"{built.left_out} left out: --max-tokens reached"] if built.left_out else []
    print(f"indexed {built.files} files, {built.header['tokens']:,} tokens{' (' + '; '.join(notes) + ')' if notes else ''} "
          f"in {built.seconds:.1f} s -> {out} ({_megabytes(out):.0f} MB)")
    return 0


def info_from_args(args) -> int:
    store = Datastore.open(args.index)
    print(json.dumps({**store.header, "megabytes": round(_megabytes(store.directory), 1)}, indent=1))
    return 0


def _megabytes(directory: Path) -> float:
    return sum((directory / name).stat().st_size for name in FILES) / 1e6
