"""Shared pieces of the config sections: the strict base model, the error type, reference constants."""

from __future__ import annotations

import re

from pipeline.errors import CnsbenchError
from pipeline.io.strict import Strict  # noqa: F401 - the config sections' base (pipeline.io.strict)

REFERENCE_SCALES = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
REFERENCE_NEGATIVE_PROMPT = "blurry,text,caption,lowquality,lowresolution,low res,grainy,ugly"
SHIFT_NAME = re.compile(r"[a-z0-9][a-z0-9_]*")  # matched whole: SHIFT_NAME.fullmatch


class ConfigError(CnsbenchError):
    """A config that cannot be used; the message names the file, key path and value."""


