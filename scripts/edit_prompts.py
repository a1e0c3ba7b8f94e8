"""Coding-edit prompts for `specdraft bench --prompts`: functions from this Python's standard library,
each with an instruction whose answer rewrites the code (so most of the answer is in the prompt).

Spec-Bench has no code-editing category; this file stands in for one. The functions are the
first ones of a fixed list of modules that are between MIN_LINES and MAX_LINES long, so every
machine with the same Python version writes the same file. Category ``coding_edit``.

    python scripts/edit_prompts.py -o benchmarks/coding_edits.jsonl [--count 8]
    specdraft bench --prompts benchmarks/coding_edits.jsonl --methods none,hybrid-head,prompt-lookup,suffix
"""
import argparse
import ast
import importlib
import inspect
import json
import textwrap
from pathlib import Path

MODULES = ["textwrap", "shlex", "fnmatch", "glob", "calendar", "difflib", "base64", "heapq", "bisect", "statistics"]
MIN_LINES, MAX_LINES = 14, 32
INSTRUCTIONS = [
    "Add type hints to every parameter and the return value of this function. Reply with the whole function.",
    "Rename the function's local variables to longer, descriptive names. Reply with the whole function.",
    "Add a short comment above each block of this function saying what it does. Reply with the whole function.",
    "Rewrite this function so that every string formatting uses f-strings, and keep everything else as it is. "
    "Reply with the whole function.",
]


def functions(module_name: str):
    """(name, source) of the module's top-level functions, in file order."""
    module = importlib.import_module(module_name)
    source = Path(inspect.getsourcefile(module)).read_text()
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, textwrap.dedent(ast.get_source_segment(source, node))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--count", type=int, default=8)
    args = ap.parse_args()
    rows = []
    for module_name in MODULES:
        for name, src in functions(module_name):
            if MIN_LINES <= src.count("\n") + 1 <= MAX_LINES:
                instruction = INSTRUCTIONS[len(rows) % len(INSTRUCTIONS)]
                rows.append({"question_id": f"{module_name}.{name}", "category": "coding_edit",
                             "turns": [f"{instruction}\n\n```python\n{src}\n```"]})
                break  # one function a module
        if len(rows) == args.count:
            break
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
