"""Shared pieces of the config sections: the strict base model, the error type, reference constants."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

REFERENCE_SCALES = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
REFERENCE_NEGATIVE_PROMPT = "blurry,text,caption,lowquality,lowresolution,low res,grainy,ugly"
SHIFT_NAME = re.compile(r"[a-z0-9][a-z0-9_]*")  # matched whole: SHIFT_NAME.fullmatch


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file, key path and value."""


class Strict(BaseModel):
    # allow_inf_nan=False: NaN or infinite numbers anywhere in a config are refused.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
