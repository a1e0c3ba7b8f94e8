"""Training text for a drafting head, taken from files every Python install has.

A head learns how the *target* continues text, so the text itself only has to look like what
the target will be asked to write: prose in markdown with code in it (the long descriptions of
installed packages) and Python source (the standard library). No benchmark prompt is used.
Each document becomes one chat: a short user request, then the document as the answer.
"""
from __future__ import annotations

import email
import glob
import os
import random
import sysconfig
from dataclasses import dataclass


@dataclass(frozen=True)
class Document:
    request: str  # the user turn
    answer: str  # the assistant turn (the text the head learns from)


def package_readmes(min_chars: int = 1500) -> list[Document]:
    """Long descriptions (markdown READMEs) of the installed distributions."""
    import site

    docs = []
    seen = set()
    for root in [*site.getsitepackages(), site.getusersitepackages()]:
        for path in sorted(glob.glob(os.path.join(root, "*.dist-info", "METADATA"))):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    msg = email.message_from_file(f)
            except OSError:
                continue
            name = msg.get("Name", "")
            body = msg.get_payload() or msg.get("Description", "") or ""
            if not isinstance(body, str) or len(body) < min_chars or name.lower() in seen:
                continue
            seen.add(name.lower())
            docs.append(Document(f"Write the README of the Python package {name}.", body.strip()))
    return docs


def stdlib_sources(min_chars: int = 3000) -> list[Document]:
    """Top-level modules of the standard library, as code answers."""
    std = sysconfig.get_paths()["stdlib"]
    docs = []
    for path in sorted(glob.glob(os.path.join(std, "*.py"))):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        if len(text) < min_chars:
            continue
        mod = os.path.basename(path)[:-3]
        docs.append(Document(f"Write Python's {mod} module.", f"```python\n{text.strip()}\n```"))
    return docs


def default_corpus(seed: int = 0, code_share: float = 0.3) -> list[Document]:
    """READMEs and standard-library code, shuffled, with about ``code_share`` of code documents."""
    rng = random.Random(seed)
    prose, code = package_readmes(), stdlib_sources()
    rng.shuffle(prose)
    rng.shuffle(code)
    n_code = min(len(code), int(len(prose) * code_share / (1 - code_share)))
    docs = prose + code[:n_code]
    rng.shuffle(docs)
    return docs


# Requests in the spirit of a chat assistant's workload (writing, roleplay, reasoning, maths,
# coding, extraction, science, humanities, translation, summarization, questions, documents),
# made from templates and the machine's own README text. A head learns best from the target's
# answers to such requests (its own words), which `heads.data.record_generation` records.
_TOPICS = ["caching", "remote work", "electric cars", "the history of the printing press", "bees", "sleep",
           "learning a new language", "open source software", "climate change", "chess", "urban gardens",
           "the Roman empire", "black holes", "coffee", "public libraries", "video games", "volcanoes",
           "the stock market", "marathon training", "photosynthesis", "jazz", "recycling", "mountains",
           "artificial intelligence", "the moon landing", "friendship", "time management", "ocean tides"]
_WRITING = ["Write a short blog post about {t}.", "Write a poem about {t}.", "Write a persuasive essay on {t}.",
            "Write an email to a colleague about {t}.", "Write a short story that involves {t}.",
            "Compose a product description for something related to {t}."]
_ROLES = ["a pirate captain", "a medieval knight", "a tour guide in Paris", "a detective", "a chef",
          "a startup founder", "a high-school physics teacher", "a travel agent", "a museum curator"]
_ROLEPLAY = ["Pretend you are {r}. Tell me about {t}.", "You are {r}. How would you explain {t} to a child?"]
_EXPLAIN = ["Explain {t} in simple terms.", "What are the main arguments for and against {t}?",
            "Give me five interesting facts about {t}.", "How does {t} affect everyday life?",
            "Describe the history of {t}.", "What should a beginner know about {t}?"]
_CODE = ["reverses a linked list", "checks whether a string is a palindrome", "merges two sorted lists",
         "computes the n-th Fibonacci number with memoization", "parses a CSV file into dictionaries",
         "finds the longest common prefix of a list of strings", "implements binary search",
         "counts word frequencies in a text", "validates an email address with a regular expression",
         "flattens a nested list", "implements a LRU cache", "converts Roman numerals to integers",
         "performs a breadth-first search on a graph", "computes the GCD of two numbers",
         "removes duplicates from a list while keeping order", "implements quicksort",
         "reads a JSON file and prints its keys", "checks whether a number is prime",
         "implements a stack with push, pop and peek", "rotates a matrix by 90 degrees"]
_LANGS = ["Python", "JavaScript", "C++", "Java", "Go", "Rust"]
_CODING = ["Write a {l} function that {c}.", "How do I write code that {c} in {l}? Explain the approach.",
           "Write {l} code that {c}, with comments and an example."]
_TARGET_LANGS = ["German", "French", "Spanish", "Chinese", "Italian"]


def _math_request(rng: random.Random) -> str:
    a, b, c = rng.randint(3, 99), rng.randint(3, 99), rng.randint(2, 12)
    return rng.choice([
        f"A shop sells pencils at {c} cents each. How much do {a} pencils cost? Show your reasoning.",
        f"Solve for x: {c}x + {a} = {b}. Explain each step.",
        f"What is {a} * {b} + {c}? Show the calculation step by step.",
        f"A train travels {a * 3} km in {c} hours. What is its average speed? "
        f"Then, how far does it go in {c + 2} hours?",
        f"If a rectangle has sides {a} cm and {b} cm, what are its area and perimeter?",
        f"Tom has {a} apples and gives {c} to each of his {c - 1 if c > 2 else 2} friends. How many are left?",
    ])


def _passages(docs: list[Document], rng: random.Random, chars: int = 1200) -> str:
    doc = rng.choice(docs).answer
    start = rng.randrange(0, max(1, len(doc) - chars))
    return doc[start:start + chars]


def chat_requests(n: int, seed: int = 0) -> list[str]:
    """``n`` varied requests, reproducible from ``seed``."""
    rng = random.Random(seed)
    docs = package_readmes()
    out = []
    kinds = ["writing", "roleplay", "explain", "coding", "math", "translate", "summarize", "extract", "rag"]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        t = rng.choice(_TOPICS)
        if kind == "writing":
            out.append(rng.choice(_WRITING).format(t=t))
        elif kind == "roleplay":
            out.append(rng.choice(_ROLEPLAY).format(r=rng.choice(_ROLES), t=t))
        elif kind == "explain":
            out.append(rng.choice(_EXPLAIN).format(t=t))
        elif kind == "coding":
            out.append(rng.choice(_CODING).format(l=rng.choice(_LANGS), c=rng.choice(_CODE)))
        elif kind == "math":
            out.append(_math_request(rng))
        elif kind == "translate":
            text = _passages(docs, rng, 400) if docs else f"I would like to learn more about {t}."
            out.append(f"Translate the following text into {rng.choice(_TARGET_LANGS)}:\n\n{text}")
        elif kind == "summarize" and docs:
            out.append(f"Summarize the following text in a few sentences:\n\n{_passages(docs, rng)}")
        elif kind == "extract" and docs:
            out.append("Extract every name of a function, class, command or package mentioned in this text, "
                       f"as a JSON list:\n\n{_passages(docs, rng)}")
        elif docs:
            out.append(f"Answer the question using the document.\n\nDocument:\n{_passages(docs, rng)}\n\n"
                       "Question: What is this software for, and how is it used?")
        else:
            out.append(rng.choice(_EXPLAIN).format(t=t))
    return out
