"""The contract of a shift family, and the per-unit context families share.

A family is one kind of shift: a concept slider, a prompt nuisance, a classic corruption,
a masked background scenario, an attribute edit.  The generate stage hands each family
the shifts of one (class, seed) work unit that belong to it, with the family's scale
grid, and gets back one :class:`ShiftImages` per shift (images aligned with the scales,
plus what the family did to each image in ``params``).

Families that transform an existing image (``generates_base = False``) ask the unit's
:class:`UnitContext` for its scale-0 image and, when ``needs_mask``, its object mask;
the context gets them once per unit from the build's image source (``source:`` in the
config, see :mod:`pipeline.sources`).  Families that generate from the seed themselves
(sliders, prompts) run first and share their scale-0 image through the context, so a
corruption of the same build starts from exactly the slider trajectories' scale 0.

Contract: ``__init__`` stores the config and pickles cheaply; ``setup`` loads models
(once per worker); ``generate`` must be deterministic for (class, seed, shift, scale)
and retry-safe.  Class attributes describe the family for ``validate`` and ``cnsbench ls``
without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from pipeline.config import BuildConfig, FamilyGroup
    from pipeline.perf.evals import UnetCost


@dataclass(frozen=True)
class CardHeadline:
    """The card benchmark a family's outputs are scored as (``cnsbench card``).

    ``benchmark``: its name, the ``family`` of a suite entry (one paper's benchmark; families
    that share one, as slider and prompt share ``cns``, declare the same); ``function``: its
    headline metrics, ``"module:function"`` taking the card's tables
    (``pipeline.card.headline.Tables``) and returning a ``Headline`` (named, not imported: the
    card sits above the families); ``metrics``: each headline metric with its direction (True:
    higher is better), the metric's definition that a card may not contradict."""

    benchmark: str
    function: str
    metrics: dict[str, bool] = field(default_factory=dict)


class NoOptions(BaseModel):
    """Options of a family that has none."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class BaseImage:
    """A unit's scale-0 image and, when known, the object mask (``mask[y, x]`` True on the object)."""

    image: Any  # PIL.Image.Image, RGB, at the build's saved size
    mask: "np.ndarray | None" = None
    info: dict[str, Any] = field(default_factory=dict)  # recorded in params (e.g. mask area, source file)
    unusable: str | None = None  # set when e.g. the mask fails its quality check: images are filtered out
    unet_evals: float = 0.0  # UNet sample-evaluations that making it cost (the seed source's generation)


@dataclass
class ShiftImages:
    """The images of one trajectory, aligned with the scales it was asked for."""

    images: list[Any]  # PIL images; the scale-0 entry may be the very object other shifts share
    params: list[dict[str, Any]] | None = None  # per image, JSON-able: what was done to it
    unet_evals: float = 0.0  # UNet sample-evaluations attributed to this trajectory
    seconds: float = 0.0  # wall time attributed to this trajectory
    unusable: str | None = None  # reason the whole trajectory must be filtered out (not failed)


class UnitContext:
    """What the families of one (class, seed) unit share: ids, and the lazily loaded base image."""

    def __init__(
        self,
        class_id: int,
        class_name: str,
        seed: int,
        load_base: Callable[["UnitContext"], BaseImage] | None = None,
    ) -> None:
        self.class_id = class_id
        self.class_name = class_name
        self.seed = seed
        self._load_base = load_base
        self._base: BaseImage | None = None

    def base(self) -> BaseImage:
        """The scale-0 image (and mask) of this unit, from the build's source, loaded once."""
        if self._base is None:
            if self._load_base is None:
                raise RuntimeError("this build has no image source for transforming families")
            self._base = self._load_base(self)
        return self._base

    def set_base(self, base: BaseImage) -> None:
        """Share a scale-0 image a generating family made, unless one is already set."""
        if self._base is None:
            self._base = base

    @property
    def has_base(self) -> bool:
        return self._base is not None

    def sibling(self, class_id: int, class_name: str, seed: int) -> "UnitContext":
        """The context of another (class, seed) of the same build and image source.

        For families that need a second image (e.g. a random background from another unit).
        """
        return UnitContext(class_id, class_name, seed, self._load_base)


class Family:
    """Base class of a shift family (see the module docstring for the contract)."""

    kind: ClassVar[str] = ""
    Options: ClassVar[type[BaseModel]] = NoOptions
    # What a scale means for this family, for docs, `cnsbench ls` and the report.
    scale_meaning: ClassVar[str] = "scale"
    # Scale grid used when neither the family entry nor (for the primary family) the benchmark sets one.
    default_scales: ClassVar[list[float] | None] = None
    # True: makes its own scale 0 from the seed (text-to-image); False: transforms the source image.
    generates_base: ClassVar[bool] = False
    # True: needs the object mask of the base image (source.masks must provide one).
    needs_mask: ClassVar[bool] = False
    # Analyses added to the build's report whenever this family is part of it.
    analyses: ClassVar[tuple[str, ...]] = ()
    # The text-to-image sampler (``pipeline.models.sampler.SAMPLERS``) of a build whose primary
    # family (``generator.kind``) this is: the seed source and the families that regenerate a
    # base image share it, so their scale 0 is this family's.
    sampler_kind: ClassVar[str] = "slider"
    # True: the family makes an image at any scale of its range (``generate`` takes any float
    # between its grid's scales), so failure points can be refined below the grid
    # (``cnsbench refine``); False: only its grid's scales mean something (ImageNet-D's 0/1).
    continuous_scale: ClassVar[bool] = False
    # The card benchmark whose headline metrics score this family's outputs (``cnsbench card``);
    # None: the family gives none of its own.
    headline: ClassVar[CardHeadline | None] = None

    @classmethod
    def source_classes(cls, config: "BuildConfig", group: "FamilyGroup") -> list[int]:
        """Classes outside the benchmark whose scale-0 images the family reads (``UnitContext.sibling``),
        so the image source prepares them too (e.g. XIMAGENET-12's random backgrounds)."""
        return []
    # False: the OOC filter keeps every image of this family unscored (see ``uses_ooc_filter``).
    ooc_filter: ClassVar[bool] = True

    def __init__(self, config: "BuildConfig", group: "FamilyGroup", device: str = "cpu", dtype: Any = None) -> None:
        self.config = config
        self.group = group
        self.options = group.options
        self.device = device
        self.dtype = dtype

    # ---------------------------------------------------------------- validation (no torch)
    @classmethod
    def check_shifts(cls, shifts: list[str], options: BaseModel) -> list[str]:
        """Problems with the shift names for this family (e.g. unknown corruption); [] when fine."""
        return []

    @classmethod
    def check_scales(cls, scales: list[float]) -> list[str]:
        """Problems with the scale grid for this family (e.g. a severity beyond the table); [] when fine."""
        return []

    @classmethod
    def uses_ooc_filter(cls, options: BaseModel) -> bool:
        """Whether the OOC filter judges this family's images (else they are kept, scores NaN)."""
        return cls.ooc_filter

    @classmethod
    def missing_files(cls, config: "BuildConfig", group: "FamilyGroup", pairs: list[tuple[int, str]]) -> list[str]:
        """One line per file the family needs and cannot find, naming the config key.

        ``pairs``: the (class id, shift) pairs still to make, for per-(class, shift) files.
        """
        return []

    # ---------------------------------------------------------------- cost (no torch)
    @classmethod
    def unet_cost(cls, config: "BuildConfig", group: "FamilyGroup") -> "UnetCost | None":
        """What one (class, seed) unit of ``group`` costs the UNet, as the family's own
        ``ShiftImages.unet_evals`` will count it (:mod:`pipeline.perf.evals`); None: it runs none."""
        return None

    @classmethod
    def slider_count(cls, config: "BuildConfig", group: "FamilyGroup") -> int:
        """The (class, shift) slider files ``group`` reads (the plan's "sliders needed")."""
        return 0

    # ---------------------------------------------------------------- work
    def setup(self) -> None:
        """Load models; called once per worker before the first ``generate``."""

    def generate(self, ctx: UnitContext, shifts: list[str], scales: list[float]) -> dict[str, ShiftImages]:
        """One :class:`ShiftImages` per shift of ``shifts``, images aligned with ``scales``."""
        raise NotImplementedError


def extra_source_classes(config: "BuildConfig") -> list[int]:
    """The classes outside ``benchmark.classes`` that the build's families read images of."""
    from pipeline.registry import FAMILIES

    wanted = {c for g in config.family_groups() for c in FAMILIES.get(g.kind).source_classes(config, g)}
    return sorted(wanted - set(config.benchmark.classes))


def base_sampler_kind(config: "BuildConfig") -> str:
    """The sampler kind whose scale 0 a build's seed source shares: its primary family's
    (``generator.kind``; ``slider`` for a kind the registry does not know)."""
    from pipeline.registry import FAMILIES

    try:
        return FAMILIES.get(config.generator.kind).sampler_kind
    except KeyError:
        return "slider"
