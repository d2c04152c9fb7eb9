"""A config's hash counts the keys added since outputs were first hashed only when they are set,
so the outputs built before them keep their hash (and are not re-aggregated by a card)."""

from __future__ import annotations

import hashlib
import json


def _old_style_hash(data: dict) -> str:
    """The hash as computed before ``refine`` and the vlm image keys existed."""
    data = dict(data)
    data.pop("resources", None)
    data.pop("refine", None)
    # Every entry then held a vlm's protocol, dtype and prompt_template (None unless a vlm's).
    data["classifiers"] = [{"protocol": None, "dtype": None, "prompt_template": None,
                            **{k: v for k, v in c.items() if k not in ("vision_dtype", "image_aspect_ratio")}}
                           for c in data["classifiers"]]
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_defaults_of_added_keys_leave_the_hash_as_it_was_and_set_ones_change_it():
    from pipeline.cli import TINY_CONFIG
    from pipeline.config import config_hash, load_config, parse_config, resolved_dict

    cfg = load_config(TINY_CONFIG)
    raw = resolved_dict(cfg)
    assert raw["refine"] == {"rounds": 3} and "vision_dtype" not in raw["classifiers"][0]  # a vlm's key only
    assert config_hash(cfg) == _old_style_hash(raw)
    raw["refine"] = {"rounds": 5}
    assert config_hash(parse_config(raw, source="t")) != _old_style_hash(resolved_dict(cfg))
