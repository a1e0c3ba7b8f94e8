"""A model directory's config as transformers resolves it (AutoConfig: config.json plus the model
class's defaults), reduced to the fields specdraft reads, and snapshotted (models.snapshots) so
that a later start reads it without importing transformers.

Only configs whose RoPE is the default kind are snapshotted: the other kinds' tables come from
transformers' own initialisers (llama.rope_tables), which want the real config object.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from . import snapshots

# Every config attribute the loaders read (llama.not_native / read_spec / rope_tables, pipeline);
# tests/test_snapshots.py checks that those modules read no other
FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "sliding_window",
          "layer_types", "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act", "rope_parameters",
          "rope_theta", "rope_freq_factors", "eos_token_id")
_FILES = ("config.json",)


class ConfigView(SimpleNamespace):
    """The FIELDS a transformers config had, as attributes; a field it lacked is absent here too
    (``getattr(view, name, default)`` gives the default, as it did)."""


def _fields(config) -> dict | None:
    """config's FIELDS as JSON values, or None where a snapshot could not stand in for it."""
    params = getattr(config, "rope_parameters", None) or {}
    if not isinstance(params, dict) or params.get("rope_type", "default") != "default":
        return None
    missing = object()
    values = {name: v for name in FIELDS if (v := getattr(config, name, missing)) is not missing}
    try:
        if json.loads(json.dumps(values)) != values:  # tuples, non-finite floats: keep the real config
            return None
    except (TypeError, ValueError):
        return None
    return values


def load_config(path: str | Path):
    """The config of the model directory ``path``: a ConfigView from its snapshot, else
    transformers' AutoConfig (raising what it raises), snapshotted where it can be."""
    path = Path(path)
    digest = snapshots.key(path, _FILES)
    saved = snapshots.load("config", digest)
    if saved is not None and isinstance(saved.get("fields"), dict):
        return ConfigView(**saved["fields"])
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    values = _fields(config)
    if values is not None:
        snapshots.save("config", digest, {"fields": values})
    return config


def generation_eos(path: str | Path, config) -> int | list[int] | None:
    """The end-of-sequence id(s) of generation_config.json, as transformers' GenerationConfig reads
    them, or the config's where that file is missing or unreadable."""
    try:
        data = json.loads((Path(path) / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        return getattr(config, "eos_token_id", None)
    return data.get("eos_token_id")
