"""Paths of this checkout: the repository root and the configs the commands default to."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO_ROOT / "configs" / "demo.yaml"  # the trained miniature world (assets/world)
TINY_CONFIG = REPO_ROOT / "configs" / "tiny.yaml"  # random-weight components made on demand (assets/tiny)
