"""Image sources for evaluate-only runs: existing images -> trajectory rows.

Role: the front end of ``cnsbench evaluate`` (:mod:`pipeline.evaluate`).  A *source* is a
set of images that already exist; :func:`open_source` indexes one into light *pointer
rows* (:data:`SOURCE_ROW`: a trajectory's coordinates, ids and where each of its images
lives), and :class:`~pipeline.stages.load.LoadStage` turns pointer rows into the pipeline's trajectory rows
(:data:`pipeline.plan.schema.GENERATED`, or :data:`pipeline.plan.schema.FILTERED` with the filter
columns filled as "not filtered" when the filter is off).  From there the build's own
stages run unchanged.  Only pointers travel through the driver; image bytes are read by
the load actors, so a source of any size streams.

Source kinds (auto-detected by :func:`detect_kind`, or chosen explicitly):

``cns``
    The published CNS-Bench layout: ``annotations_cns.json`` (keys ``info, scales,
    classes, shifts, images``) next to ``{shift}/{NNN_class name}/seed_SSSS_scale_XXXX.jpg``.
    Entries are grouped into trajectories (shift, class, seed) ordered by scale; the label
    is the ImageNet index at the start of the class folder name (the entry's ``class``
    must agree).  If a trajectory lacks its scale-0 image but another shift of the same
    (class, seed) has one, that image is used: in CNS-Bench scale 0 is the same image for
    every shift of a (class, seed).
``webdataset``
    A directory of WebDataset tars, e.g. a ``cnsbench build`` output (``images/*.tar``).
    With committed ``samples`` Parquet shards next to them (a build output), the sample
    coordinates come from those; otherwise from each member's ``.json`` (``class_id`` /
    ``label`` / ``cls`` / ``class``, ``shift`` [default ``none``], ``seed`` [default: index
    within the class], ``scale`` [default 0]).  Images are read by byte range, the tars
    are never unpacked.
``imagenet_c``
    The ImageNet-C release: ``<corruption>/<severity 1..5>/<wnid>/*.JPEG`` (optional
    ``clean/<wnid>/`` as scale 0); corruptions are shifts, severities scales
    (:mod:`pipeline.sources.imagenet_c`).
``folders``
    ``root/<class folder>/<image>``: one image per trajectory, shift ``none``, scale 0,
    seed = index of the image within its class (files sorted by folder, then name; adding
    files therefore renumbers later ones).  Folder -> class id comes from a label map
    (JSON ``{folder name: class id}``), else from a leading integer in the folder name
    (``022_bald eagle``), else from the folder name as a class name of the label space.
``imagenet_e``
    Released ImageNet-E sets, ``root/<set>/<class folder>/<image>`` with an originals set:
    :mod:`pipeline.sources.imagenet_e` (attribute = shift, level = scale, originals = 0).

``imagenet_d``
    The released ImageNet-D layout (:mod:`pipeline.sources.imagenet_d`): nuisance-kind
    folders of class folders, the 113-class label space with its multi-id rule.

Ids follow :mod:`pipeline.plan` (``painting_style/022/seed_0034_scale_1000``), so an
evaluate output has the same layout as a build output and resumes the same way.
Malformed sources raise :class:`SourceError` naming the file and the problem.

Modules: :mod:`.common` (row schema, :class:`Source`, shared helpers), :mod:`.detect`
(the layout table, detection, :func:`open_source`), one module per layout (:mod:`.cns`,
:mod:`.webdataset`, :mod:`.folders`, :mod:`.imagenet_c`, :mod:`.imagenet_d`, :mod:`.imagenet_e`,
:mod:`.ximagenet`); the load stage that reads the images is :mod:`pipeline.stages.load`.
"""

from pipeline.sources.cns import load_cns
from pipeline.sources.common import (
    ANNOTATIONS,
    IMAGE_EXTENSIONS,
    NO_SHIFT,
    SOURCE_ROW,
    Source,
    SourceError,
)
from pipeline.sources.detect import (
    RELEASED,
    RELEASED_LAYOUTS,
    SOURCE_KINDS,
    detect_kind,
    open_source,
)
from pipeline.sources.folders import load_folders
from pipeline.sources.webdataset import load_webdataset

__all__ = [
    "ANNOTATIONS", "IMAGE_EXTENSIONS", "NO_SHIFT", "RELEASED", "RELEASED_LAYOUTS", "SOURCE_KINDS", "SOURCE_ROW",
    "Source", "SourceError", "detect_kind", "load_cns", "load_folders", "load_webdataset", "open_source",
]
