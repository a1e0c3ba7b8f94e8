"""`specdraft perplexity` on a tiny model: the windows, the numbers (against one forward per
window, computed here), several formats over the same tokens, and its one-line errors."""
from __future__ import annotations

import json
import math

import pytest
import torch

from _tiny import ALPHABET, make_cli_model
from specdraft.bench.perplexity import windows
from specdraft.cli import main
from specdraft.errors import ParameterError

TEXT = "the cat sat on the mat. the dog sat on the log. " * 6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("ppl")
    text = root / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    return make_cli_model(root / "tiny"), text


def direct_nll(model_dir, text: str, context: int, fmt: str) -> tuple[float, int]:
    """Mean NLL of every token after the first of each window, one whole forward a window."""
    from specdraft.pipeline import load_model

    loaded = load_model(str(model_dir), dtype="fp32", weight_format=fmt, max_length=context)
    ids = loaded.tokenizer(text)["input_ids"]
    nll = []
    for w in windows(ids, context):
        loaded.model.reset()
        lp = torch.log_softmax(loaded.model.forward(torch.tensor(w)).logits[:-1], -1)
        nll += (-lp.gather(1, torch.tensor(w[1:])[:, None])[:, 0]).tolist()
    return sum(nll) / len(nll), len(nll)


def test_windows():
    assert windows(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert windows(list(range(9)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # a last window of one scores nothing
    with pytest.raises(ParameterError):
        windows([1], 4)
    with pytest.raises(ParameterError):
        windows([1, 2, 3], 1)


def test_perplexity_per_format_is_one_forward_per_window(tiny, tmp_path, capsys):
    model_dir, text = tiny
    out = tmp_path / "ppl.json"
    assert main(["perplexity", str(text), "--model", str(model_dir), "--format", "w8a8,dense", "--context", "16",
                 "--max-tokens", "0", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(ALPHABET) >= set(TEXT) and report["windows"] == -(-len(TEXT) // 16)
    for r, fmt in zip(report["results"], ["w8a8", "dense"], strict=True):
        nll, n = direct_nll(model_dir, TEXT, 16, fmt)
        assert r["tokens"] == n == len(TEXT) - report["windows"]
        assert r["nll"] == pytest.approx(nll, rel=1e-6) and r["perplexity"] == pytest.approx(math.exp(nll), rel=1e-6)
        assert 0 < r["stderr"] < r["nll"]
    first, second = report["results"]
    assert first["nll_minus_first"] == 0 and first["nll_minus_first_stderr"] == 0
    assert second["nll_minus_first"] == pytest.approx(second["nll"] - first["nll"], abs=1e-9)
    assert "perplexity" in capsys.readouterr().out


@pytest.mark.parametrize("args, contains", [
    (["/no/such/file.txt"], "cannot read"),
    (["TEXT", "--context", "1"], "context"),
    (["TEXT", "--max-tokens", "-3"], "max-tokens"),
    (["TEXT", "--format", "gguf:int3"], "--format"),
    (["EMPTY"], "at least 2"),
])
def test_perplexity_errors_are_one_line(tiny, tmp_path, capsys, args, contains):
    model_dir, text = tiny
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    args = [str(text) if a == "TEXT" else str(empty) if a == "EMPTY" else a for a in args]
    try:
        rc = main(["perplexity", *args, "--model", str(model_dir), "--format", "w8a8"]
                  if "--format" not in args else ["perplexity", *args, "--model", str(model_dir)])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and contains.lower() in err.lower(), err
