"""``families`` and ``source``: further shift families and the image source of a build."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from pipeline.config.base import Strict


class FamilySpec(Strict):
    """A further shift family of the build, on the same (class, seed) units as the primary one."""

    kind: str = Field(..., description="registry key, see `cnsbench ls`")
    shifts: list[str] = Field(..., min_length=1)
    scales: list[float] | None = Field(None, description="this family's scale grid; default: the family's own")
    options: dict[str, Any] = Field(default_factory=dict)


class MaskSpec(Strict):
    """Where object masks come from (families with ``needs_mask``)."""

    kind: str = Field("none", description="registry key of a mask provider, see `cnsbench ls`")
    path: str | None = Field(None, description="mask folder, or an XIMAGENET-12 release root (kind 'folder')")
    options: dict[str, Any] = Field(default_factory=dict)


class SourceSpec(Strict):
    """Where a trajectory's scale-0 image comes from for families that transform images."""

    kind: str = Field("seed", description="registry key: 'seed' (text-to-image from the seed) or a collection")
    path: str | None = Field(None, description="collection location (folders, WebDataset)")
    label_map: str | None = Field(None, description="JSON {folder name: class id} for class folders")
    follow_symlinks: bool = Field(False, description="follow symlinks that leave the collection")
    masks: MaskSpec = MaskSpec()


@dataclass(frozen=True)
class FamilyGroup:
    """A resolved family of a build: its kind, shifts, scale grid and validated options."""

    kind: str
    shifts: tuple[str, ...]
    scales: tuple[float, ...]
    options: Any  # the family's Options model instance
    primary: bool = False

    @property
    def where(self) -> str:
        return "generator" if self.primary else f"families[{self.kind}]"
