"""The ImageNet classifiers a benchmark evaluates, behind one contract.

:class:`BaseClassifier` (:mod:`pipeline.models.classifier_kind`) is the contract every kind
of ``CLASSIFIERS`` implements, with the class-level hooks the project asks a kind (its
options model, files, hub artefacts, problems, identity and cost).  A ranking kind derives
from :class:`Classifier` here (``predict``), a kind that asks from
:class:`pipeline.models.classifier_kind.AskingClassifier` (``answer``, the vlms of
:mod:`pipeline.models.vlm`).  :func:`classify_all` runs a pool of them over a batch of
images, the one loop every stage shares.

A :class:`Classifier` maps PIL images to logits over its own output space and states how
each output index maps to an ImageNet-1k id (:attr:`Classifier.out_to_label`, from
``label_map``; identity over 1000 outputs by default, ``-1`` for an unmapped output).
:func:`topk_predictions` turns logits into ImageNet-id top-1/top-5 and the probability of
the true class.  Two kinds are registered: :class:`TimmClassifier` (any timm model, hub tag
or local weights) and :class:`OpenClipZeroShot` (open_clip with a zero-shot head built
from the ImageNet class names and prompt templates).  A third kind,
:class:`TorchScriptClassifier`, loads any ``torch.jit.save`` file with a stated input
size and mean/std, for models timm cannot express (e.g. a linear model on pixels), and
:class:`TorchHubClassifier` loads a ``torch.hub`` entry point (DINOv2 with its linear head).

Input preprocessing is chosen per classifier by ``preprocess`` (:mod:`pipeline.config.protocol`):
``cns`` is the original CNS-Bench transform for every model (Resize 256 bicubic, CenterCrop
224, ImageNet mean/std), ``model`` the model's own data config, or an explicit transform.
:meth:`Classifier.predict` applies it, the only place where images become model inputs.
"""

from __future__ import annotations

import difflib
import io
import json
import os
from typing import Any, Sequence

import torch

from pipeline.config import ClassifierSpec
from pipeline.errors import CnsbenchError
from pipeline.io import zip_archive
from pipeline.io.regular import read_bounded
from pipeline.labels import LabelSpace, label_space
from pipeline.models.cache import shared
from pipeline.models.classifier_kind import (  # noqa: F401 (the contract's home: pipeline.models.classifier_kind)
    AskingClassifier,
    BaseClassifier,
    HubRef,
    local_file_ref,
)
from pipeline.models.detectors import load_open_clip, load_timm, timm_transform
from pipeline.models.footprint import (
    ModelSize,
    dinov2_timm_arch,
    input_side,
    meta_forward_peak,
    open_clip_sizes,
    param_count,
    timm_meta,
)
from pipeline.models import stored_preprocess
from pipeline.models.precision import FLOAT32, ModelPrecision

# Images per forward inside predict(); bounds activation memory of big models.
PREDICT_CHUNK = 64
# Prompts per text-encoder forward when building a zero-shot head.
TEXT_CHUNK = 512


def load_label_map(label_map: dict[int, int] | str | None, where: str) -> dict[int, int] | None:
    """``label_map`` as ``{output index: ImageNet id}``; a string is a JSON file of that mapping."""
    if label_map is None:
        return None
    if isinstance(label_map, str):
        if not os.path.isfile(label_map):
            raise FileNotFoundError(f"{where}.label_map: file not found: {label_map}")
        with open(label_map) as f:
            raw = json.load(f)
        if not isinstance(raw, dict):
            raise CnsbenchError(f"{where}.label_map: {label_map} must hold a JSON object {{output index: class id}}")
    else:
        raw = label_map
    try:
        mapping = {int(k): int(v) for k, v in raw.items()}
    except (TypeError, ValueError) as err:
        raise CnsbenchError(f"{where}.label_map: keys and values must be integers ({err})") from None
    bad = {k: v for k, v in mapping.items() if k < 0 or not 0 <= v < 1000}
    if bad:
        raise CnsbenchError(f"{where}.label_map: output indices must be >= 0 and ImageNet ids in 0..999, got {bad}")
    return mapping


def topk_predictions(
    logits: torch.Tensor, out_to_label: Sequence[int], true_ids: Sequence[int]
) -> tuple[list[int], list[list[int]], list[float]]:
    """Logits [N, C] -> (top-1 ImageNet id, top-5 ImageNet ids, p(true class)) per image.

    Softmax is over the classifier's own output space.  Top-5 has min(5, C) entries, best
    first (ties: lower output index first); two outputs mapped to the same ImageNet id
    both appear.  ``p_true`` sums the probabilities of every output mapped to the true id
    and is 0.0 when no output maps to it.  Unmapped outputs appear as ``-1``.
    """
    if logits.ndim != 2 or logits.shape[1] != len(out_to_label):
        raise CnsbenchError(
            f"logits of shape {tuple(logits.shape)} do not match an output space of {len(out_to_label)} classes"
        )
    if logits.shape[0] != len(true_ids):
        raise CnsbenchError(f"{logits.shape[0]} logit rows but {len(true_ids)} true ids")
    probs = logits.float().softmax(dim=-1).cpu()
    mapping = torch.as_tensor(list(out_to_label), dtype=torch.long)
    k = min(5, probs.shape[1])
    # A stable sort, not topk: ties (e.g. saturated or constant logits) resolve to the
    # lowest output index, so results do not depend on the backend's topk kernel.
    top = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]
    top5 = mapping[top].tolist()
    top1 = [row[0] for row in top5]
    truth = torch.as_tensor(list(true_ids), dtype=torch.long)
    match = mapping.unsqueeze(0) == truth.unsqueeze(1)  # [N, C]
    p_true = (probs * match).sum(dim=-1).tolist()
    return top1, top5, p_true


class Classifier(BaseClassifier):
    """Base of the ranking kinds: ``predict(images) -> logits [N, C]`` and ``out_to_label`` (length C)."""

    def __init__(self, spec: ClassifierSpec, device: str, labels: LabelSpace | None = None) -> None:
        self.spec = spec
        self.device = device
        self.labels = labels or label_space("imagenet")
        self.where = f"classifiers[{spec.name}]"
        self._label_map = load_label_map(spec.label_map, self.where)
        self._out_to_label: list[int] = []
        self._keep: list[int] | None = None  # outputs the top-1 ranges over (labels.outputs), None: all
        self.preprocess_choice = spec.preprocess or "model"
        self._input_transform = self._choose_transform(spec.preprocess)
        self._shifted_transform = self._choose_transform(spec.preprocess, shifted=True)
        self.precision: ModelPrecision = FLOAT32

    def _choose_transform(self, choice: Any, shifted: bool = False):
        """The protocol's transform for ``choice`` (of images at a scale > 0 with ``shifted``);
        None: the model's own (:meth:`_preprocess`)."""
        from pipeline.config.protocol import CNS_CLASSIFIER, build_transform, preprocess_of

        p = preprocess_of(choice, CNS_CLASSIFIER)
        return build_transform(p, shifted) if p is not None else None

    def inputs(self, images: Sequence[Any], shifted: Sequence[bool] | None = None) -> torch.Tensor:
        """PIL images -> the stacked input tensor the model sees (on CPU).

        ``shifted[i]``: image i is at a scale > 0 (a transform with ``shifted_crop_only``
        skips its resize, see :class:`pipeline.config.protocol.Preprocess`).
        """
        plain = self._input_transform or self._preprocess
        moved = self._shifted_transform or self._preprocess
        flags = shifted if shifted is not None else [False] * len(images)
        return torch.stack([(moved if s else plain)(im) for im, s in zip(images, flags, strict=True)])

    @property
    def out_to_label(self) -> list[int]:
        """ImageNet id of each output index (-1 where the label map leaves an output unmapped)."""
        return self._out_to_label

    def _map_outputs(self, n_out: int) -> None:
        """Class id of each of ``n_out`` outputs: identity when they match the label space,
        else through ``label_map`` (unmapped outputs get -1)."""
        if self._label_map is None and self.labels.outputs is not None and n_out == len(self.labels):
            # A space restricted to some classes (XIMAGENET-12's 12-way accuracy): only their outputs compete.
            self._keep = list(self.labels.outputs)
            self._out_to_label = list(self.labels.outputs)
        elif self._label_map is None and self.labels.imagenet_ids is not None and n_out == 1000 != len(self.labels):
            # An ImageNet-1k model over a space of ImageNet id sets (ImageNet-D): the multi-id rule.
            self._out_to_label = self.labels.outputs_from_imagenet(n_out)
        elif self._label_map is None:
            if n_out != len(self.labels):
                raise CnsbenchError(
                    f"{self.where}: model has {n_out} outputs but the label space {self.labels.key!r} has "
                    f"{len(self.labels)} classes; give a label_map (output index -> class id)"
                )
            self._out_to_label = list(range(n_out))
        else:
            outside = sorted(k for k in self._label_map if k >= n_out)
            if outside:
                raise CnsbenchError(f"{self.where}.label_map: output indices {outside[:10]} >= the model's {n_out} outputs")
            self._out_to_label = [self._label_map.get(i, -1) for i in range(n_out)]

    def set_precision(self, precision: ModelPrecision) -> None:
        """Run the model in ``precision`` (``resources.classify``; :mod:`pipeline.models.precision`):
        its weights cast and laid out once here, each batch in :meth:`predict`."""
        model = getattr(self, "model", None)
        if isinstance(model, torch.nn.Module):
            self.model = precision.prepare(model)
        self.precision = precision

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a preprocessed batch: the kind's ``self.model`` unless it overrides this."""
        return self.model(x)

    def _preprocess(self, image: Any) -> torch.Tensor:
        """One image as the model's input: the kind's ``self.transform`` unless it overrides this."""
        return self.transform(image)

    @torch.inference_mode()
    def predict(self, images: Sequence[Any], shifted: Sequence[bool] | None = None) -> torch.Tensor:
        """PIL images -> float32 logits [N, C] on CPU, in chunks of :data:`PREDICT_CHUNK`
        (``shifted``: see :meth:`inputs`), the model run in its :attr:`precision`."""
        if not images:
            return torch.empty(0, len(self.out_to_label))
        outs = []
        for i in range(0, len(images), PREDICT_CHUNK):
            part = None if shifted is None else shifted[i : i + PREDICT_CHUNK]
            x = self.precision.inputs(self.inputs(images[i : i + PREDICT_CHUNK], part).to(self.device))
            with self.precision.running(self.device):
                logits = self._forward(x).float().cpu()
            outs.append(logits[:, self._keep] if self._keep is not None else logits)
        return torch.cat(outs)


# --------------------------------------------------------------------------- timm
def timm_name_problem(name: str, local_weights: bool = False) -> str | None:
    """None if timm knows the model (an architecture, or ``arch.tag`` with a known tag), else a
    message listing close names.  With local weights only the architecture must exist."""
    import timm

    arch = name.split(".", 1)[0]
    archs = timm.list_models()
    if "." in name and not local_weights:
        tagged = timm.list_models(pretrained=True)
        if name in tagged:
            return None
        if arch in archs:
            tags = [t for t in tagged if t.startswith(arch + ".")]
            close = difflib.get_close_matches(name, tags, n=5, cutoff=0.0)
            return f"unknown pretrained tag {name!r}; tags of {arch}: {', '.join(close) or 'none'}"
    if arch in archs and ("." not in name or local_weights):
        return None
    candidates = sorted(set(timm.list_models(pretrained=True)) | set(archs))
    close = difflib.get_close_matches(name, candidates, n=5, cutoff=0.6)
    if len(close) < 5 and arch != name:
        close += [c for c in difflib.get_close_matches(arch, candidates, n=5, cutoff=0.6) if c not in close]
    return f"unknown timm model {name!r}; close names: {', '.join(close[:5]) or 'none'}"


def check_timm_name(name: str, local_weights: bool = False) -> None:
    """Raise ValueError naming close models unless timm knows ``name``."""
    problem = timm_name_problem(name, local_weights)
    if problem:
        raise CnsbenchError(problem)


class TimmClassifier(Classifier):
    """A timm ImageNet classifier; ``preprocess: model`` is the model's own data config."""

    def __init__(self, spec: ClassifierSpec, device: str, labels: LabelSpace | None = None) -> None:
        super().__init__(spec, device, labels)
        check_timm_name(spec.model, local_weights=bool(spec.checkpoint))
        try:
            self.model = load_timm(spec.model, spec.checkpoint, spec.model_kwargs, device, f"{self.where}.checkpoint")
        except FileNotFoundError:
            raise
        except Exception as err:
            raise RuntimeError(f"{self.where}: could not create timm model {spec.model!r}: {err}") from err
        self.transform = timm_transform(self.model)
        n_out = self.model.num_classes
        if not n_out:
            raise CnsbenchError(f"{self.where}: timm model {spec.model!r} has no classification head (num_classes=0)")
        self._map_outputs(n_out)

    @classmethod
    def problems(cls, spec: ClassifierSpec, where: str) -> list[str]:
        problem = timm_name_problem(spec.model, local_weights=bool(spec.checkpoint))
        return [f"{where}.model: {problem}"] if problem else []

    @classmethod
    def hub_refs(cls, spec: ClassifierSpec) -> list[HubRef]:
        return [] if spec.checkpoint else [HubRef("timm", (spec.model,))]

    @classmethod
    def cached_weights(cls, spec: ClassifierSpec) -> tuple[str | None, str | None]:
        """(cached file, hub reference) of the model's pretrained weights (none with a checkpoint)."""
        if spec.checkpoint:
            return None, None
        try:
            from huggingface_hub import try_to_load_from_cache
            from timm.models import get_pretrained_cfg

            pcfg = get_pretrained_cfg(spec.model)
        except Exception:
            return None, None
        if pcfg is None or not pcfg.hf_hub_id:
            return None, getattr(pcfg, "url", None) or None
        for fname in ("model.safetensors", "open_clip_model.safetensors", "pytorch_model.bin"):
            hit = try_to_load_from_cache(pcfg.hf_hub_id, fname)
            if isinstance(hit, str):
                return hit, f"hf-hub:{pcfg.hf_hub_id}"
        return None, f"hf-hub:{pcfg.hf_hub_id}"

    @classmethod
    def footprint(cls, spec: ClassifierSpec, images: int) -> ModelSize:
        """The timm architecture on ``meta``: its parameters and one forward at its input side."""
        model = timm_meta(spec.model, spec.model_kwargs)
        side = input_side(spec.preprocess, model)
        return ModelSize(param_count(model), meta_forward_peak(model, (1, 3, side, side)) * images)

    @classmethod
    def own_preprocess(cls, spec: ClassifierSpec) -> Any:
        """timm's data config of the model (a weightless copy on the meta device), as
        :func:`pipeline.models.detectors.timm_transform` resolves it."""
        from pipeline.models.own_preprocess import timm_own_preprocess

        return timm_own_preprocess(spec.model, spec.model_kwargs)


# --------------------------------------------------------------------------- open_clip
def zero_shot_templates(templates: str | list[str], where: str) -> list:
    """Template set name or list of ``{c}`` format strings -> list of callables ``name -> prompt``."""
    from open_clip import zero_shot_metadata as meta

    if isinstance(templates, str):
        sets = {"openai_imagenet": meta.OPENAI_IMAGENET_TEMPLATES, "simple": meta.SIMPLE_IMAGENET_TEMPLATES}
        if templates not in sets:
            raise CnsbenchError(f"{where}.templates: unknown set {templates!r}; use one of {sorted(sets)} or a list")
        return list(sets[templates])
    if not templates or any("{c}" not in t for t in templates):
        raise CnsbenchError(f"{where}.templates: every template must contain '{{c}}', got {templates!r}")
    return [lambda c, t=t: t.format(c=c) for t in templates]


def _file_identity(path: str | None) -> Any:
    """A local file as (path, mtime, size), so rewritten weights are told apart; else as given."""
    if path and os.path.isfile(path):
        st = os.stat(path)
        return (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    return path


class OpenClipZeroShot(Classifier):
    """open_clip zero-shot classifier over ImageNet class names (all 1000, or the label_map's ids)."""

    def __init__(self, spec: ClassifierSpec, device: str, labels: LabelSpace | None = None) -> None:
        super().__init__(spec, device, labels)
        self.model, self.transform, self.tokenizer = load_open_clip(
            spec.model, spec.checkpoint, spec.model_config_file, device, self.where
        )
        if self._label_map is None:
            ids = list(self.labels.outputs) if self.labels.outputs is not None else list(range(len(self.labels)))
        else:
            keys = sorted(self._label_map)
            if keys != list(range(len(keys))):
                raise CnsbenchError(f"{self.where}.label_map: zero-shot output indices must be 0..{len(keys) - 1}")
            ids = [self._label_map[k] for k in keys]
        self._out_to_label = ids
        names = [self.labels.name(i) for i in ids]
        templates = zero_shot_templates(spec.templates, self.where)
        # The head is a function of the weights, the class names and the templates: built once
        # per process (80,000 prompts for ImageNet with the OpenAI templates), whichever
        # stage or build asks for it again.
        key = ("zero-shot head", spec.model, _file_identity(spec.checkpoint), _file_identity(spec.model_config_file),
               str(self.device), tuple(names), spec.templates if isinstance(spec.templates, str) else tuple(spec.templates))
        self.head = shared(key, lambda: self._build_head(names, templates))

    @torch.inference_mode()
    def _build_head(self, names: list[str], templates: list) -> torch.Tensor:
        """[D, C] class embeddings: mean of unit-norm template embeddings, renormalised."""
        prompts = [t(n) for n in names for t in templates]
        embs = []
        for i in range(0, len(prompts), TEXT_CHUNK):
            tokens = self.tokenizer(prompts[i : i + TEXT_CHUNK]).to(self.device)
            embs.append(torch.nn.functional.normalize(self.model.encode_text(tokens).float(), dim=-1))
        emb = torch.cat(embs).view(len(names), len(templates), -1).mean(dim=1)
        return torch.nn.functional.normalize(emb, dim=-1).T.contiguous()

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        img = torch.nn.functional.normalize(self.model.encode_image(x).float(), dim=-1)
        # The head (built in float32 before any cast) stays float32 whatever the precision:
        # a bfloat16 product would round 100 x cosine to steps of 0.125 to 0.25, close classes tying.
        with torch.autocast(device_type=img.device.type, enabled=False):
            return 100.0 * img @ self.head

    @classmethod
    def hub_refs(cls, spec: ClassifierSpec) -> list[HubRef]:
        if spec.checkpoint and not local_file_ref(spec.checkpoint):
            return [HubRef("open_clip", (spec.model, spec.checkpoint))]
        return []

    @classmethod
    def footprint(cls, spec: ClassifierSpec, images: int) -> ModelSize:
        """The open_clip model on ``meta``: all its parameters, one forward of the image tower."""
        params, peak = open_clip_sizes(spec.model, spec.model_config_file, f"classifiers[{spec.name}]")
        return ModelSize(params, peak * images)

    @classmethod
    def own_preprocess(cls, spec: ClassifierSpec) -> Any:
        """open_clip's eval transform of the model (= ``clip.load``'s for the OpenAI models)."""
        from pipeline.models.own_preprocess import open_clip_own_preprocess

        return open_clip_own_preprocess(spec.model, spec.checkpoint, spec.model_config_file)


# --------------------------------------------------------------------------- torchscript


class TorchScriptClassifier(Classifier):
    """Any model saved with ``torch.jit.save``: a generic kind for models timm cannot express.

    ``checkpoint`` is the TorchScript file; it maps a float tensor ``[N, C, H, W]`` (resized
    to ``input_size``, scaled to [0, 1], then normalised with ``mean``/``std``) to logits
    ``[N, K]``.  Preprocessing comes from a ``preprocess.json`` extra file inside the
    TorchScript archive (written with ``torch.jit.save(m, path, _extra_files=...)``), and
    ``model_kwargs`` (``input_size``, ``mean``, ``std``, ``interpolation``) override it;
    ``input_size`` must come from one of them.  ``model`` is a free-form architecture name.
    Outputs map to class ids as for timm: identity when K equals the label space's size,
    else through ``label_map``.
    """

    @classmethod
    def file_problems(cls, spec: ClassifierSpec, where: str) -> list[str]:
        """An archive zip readers could read two ways (a repeated member), refused up front as at load."""
        if not spec.checkpoint or not os.path.isfile(spec.checkpoint):
            return []  # missing: the asset check's own line
        try:
            zip_archive.read_members(read_bounded(spec.checkpoint, stored_preprocess.MAX_ARCHIVE_BYTES,
                                                  f"{where}.checkpoint"), spec.checkpoint)
        except (ValueError, OSError) as err:
            return [f"{where}.checkpoint: {err}"]
        return []

    def __init__(self, spec: ClassifierSpec, device: str, labels: LabelSpace | None = None) -> None:
        super().__init__(spec, device, labels)
        if not spec.checkpoint:
            raise CnsbenchError(f"{self.where}.checkpoint: the torchscript kind needs the TorchScript file")
        if not os.path.isfile(spec.checkpoint):
            raise FileNotFoundError(f"{self.where}.checkpoint: checkpoint file not found: {spec.checkpoint}")
        unknown = sorted(set(spec.model_kwargs) - stored_preprocess.KEYS)
        if unknown:
            raise CnsbenchError(
                f"{self.where}.model_kwargs: unknown keys {unknown} for kind torchscript; "
                f"allowed: {sorted(stored_preprocess.KEYS)}"
            )
        try:  # one read, checked as torch reads it; torch loads the members checked, and only them
            data = read_bounded(spec.checkpoint, stored_preprocess.MAX_ARCHIVE_BYTES, f"{self.where}.checkpoint")
            members = zip_archive.read_members(data, spec.checkpoint)
        except ValueError as err:
            raise CnsbenchError(f"{self.where}.checkpoint: {err}") from None
        try:
            import warnings

            with warnings.catch_warnings():
                # torch >= 2.10 marks TorchScript deprecated; loading a saved file still works.
                warnings.simplefilter("ignore", FutureWarning)
                self.model = torch.jit.load(io.BytesIO(zip_archive.rebuild(members)), map_location=device)
        except Exception as err:
            raise RuntimeError(f"{self.where}: could not load TorchScript file {spec.checkpoint}: {err}") from err
        self.model.eval()
        saved = stored_preprocess.saved_preprocess(members, spec.checkpoint)
        cfg = stored_preprocess.resolve(saved, spec.model_kwargs, self.where, spec.checkpoint, "torchscript")
        size = list(cfg["input_size"])
        self.preprocess_cfg = cfg
        self._channels = size[0]
        self.transform = stored_preprocess.transform(cfg)
        with torch.inference_mode():
            probe = self.model(torch.zeros(1, *size, device=device))
        if probe.ndim != 2:
            raise CnsbenchError(f"{self.where}: the TorchScript model returns shape {tuple(probe.shape)}, expected [N, K]")
        n_out = int(probe.shape[1])
        self._map_outputs(n_out)

    @classmethod
    def footprint(cls, spec: ClassifierSpec, images: int) -> ModelSize:
        return archive_footprint(spec)

    @classmethod
    def input_transform(cls, spec: ClassifierSpec) -> dict[str, Any] | None:
        return stored_preprocess.archive_transform(spec, "torchscript")


def archive_footprint(spec: ClassifierSpec) -> ModelSize:
    """A program archive's size (TorchScript, ``torch.export``): its file as float32 weights;
    a program's activations are not known without running it."""
    size = os.path.getsize(spec.checkpoint) if spec.checkpoint and os.path.isfile(spec.checkpoint) else 0
    return ModelSize(size // 4, 0)


# --------------------------------------------------------------------------- torch hub
def parse_hub_model(model: str, where: str) -> tuple[str, str]:
    """``"<repo or local dir>:<entry point>"`` -> (repo, entry); the entry follows the last ':'."""
    repo, sep, entry = model.rpartition(":")
    if not sep or not repo or not entry or "/" not in repo:
        raise CnsbenchError(
            f"{where}.model: a torch_hub model is '<owner>/<repo>[:ref]:<entry point>' or '<local dir>:<entry point>', "
            f"e.g. 'facebookresearch/dinov2:dinov2_vitb14_reg_lc'; got {model!r}"
        )
    return repo, entry


class TorchHubClassifier(Classifier):
    """A ``torch.hub`` entry point returning an ImageNet classifier (e.g. DINOv2 with its linear head).

    ``model`` is ``'<owner>/<repo>[:ref]:<entry point>'`` (downloaded into the torch hub cache on
    first use, so only where the network is reachable) or ``'<local dir>:<entry point>'`` (a
    directory with a ``hubconf.py``).  ``model_kwargs`` go to the entry point.  The model is
    loaded when the classify stage sets up, never at validation.  There is no data config
    to read, so ``preprocess: model`` means the standard ImageNet eval transform, the one
    the DINOv2 linear heads were evaluated with (the same as ``cns``).
    """

    def __init__(self, spec: ClassifierSpec, device: str, labels: LabelSpace | None = None) -> None:
        super().__init__(spec, device, labels)
        repo, entry = parse_hub_model(spec.model, self.where)
        local = os.path.isdir(repo)
        try:
            model = torch.hub.load(repo, entry, source="local" if local else "github", **spec.model_kwargs)
        except Exception as err:
            raise RuntimeError(f"{self.where}: could not load torch hub model {spec.model!r}: {err}") from err
        self.model = model.to(device).eval()
        from pipeline.config.protocol import CNS_CLASSIFIER, build_transform

        self.transform = build_transform(CNS_CLASSIFIER)
        with torch.inference_mode():
            probe = self.model(torch.zeros(1, 3, CNS_CLASSIFIER.crop, CNS_CLASSIFIER.crop, device=device))
        if probe.ndim != 2:
            raise CnsbenchError(f"{self.where}: the hub model returns shape {tuple(probe.shape)}, expected [N, K]")
        self._map_outputs(int(probe.shape[1]))

    @classmethod
    def problems(cls, spec: ClassifierSpec, where: str) -> list[str]:
        try:
            parse_hub_model(spec.model, where)
        except ValueError as err:
            return [str(err)]
        return []

    @classmethod
    def hub_refs(cls, spec: ClassifierSpec) -> list[HubRef]:
        repo = spec.model.rpartition(":")[0]
        return [HubRef("torch hub", (spec.model, dict(spec.model_kwargs)))] if repo and not os.path.isdir(repo) else []

    @classmethod
    def footprint(cls, spec: ClassifierSpec, images: int) -> ModelSize:
        """A DINOv2 entry point as the timm architecture it matches (plus its linear head); other
        entries have no size known without running their hubconf."""
        entry = spec.model.rpartition(":")[2]
        found = dinov2_timm_arch(entry)
        if found is None:
            raise LookupError(f"no size known for torch hub entry {entry!r}")
        arch, linear_head = found
        model = timm_meta(arch, {"img_size": 224})
        head = (2 * model.embed_dim + 1) * 1000 if linear_head else 0
        return ModelSize(param_count(model) + head, meta_forward_peak(model, (1, 3, 224, 224)) * images)


# --------------------------------------------------------------------------- the pool
def classify_all(
    classifiers: Sequence[BaseClassifier],
    images: Sequence[Any],
    truth: Sequence[int],
    sample_ids: Sequence[str],
    params: Sequence[str | None],
    earlier: dict[str, list[list[int]]] | None = None,
    shifted: Sequence[bool] | None = None,
) -> list[tuple[list, list, list, list, list]]:
    """Every classifier over ``images``: per classifier (in the given order) the per-image
    top-1, top-5, p(true), answer text and exclusion (the last two None but for kinds that ask).

    Ranking classifiers run first, those that ask (``asks``) after them with their top-5
    rankings (and those of ``earlier``: classifiers of an earlier group, already run) to draw
    distractors from.  ``shifted`` (per image: scale > 0) goes to the ranking classifiers'
    ``predict``.
    """
    n = len(images)
    rankings = dict(earlier or {})
    results: dict[str, tuple[list, list, list, list, list]] = {}
    for clf in sorted(classifiers, key=lambda c: c.asks):  # stable: config order kept
        if clf.asks:  # an AskingClassifier
            out = clf.answer(images, truth, sample_ids, params, rankings)
            results[clf.name] = (out.top1, out.top5, out.p_true, out.answers, out.excluded)
        else:  # a ranking Classifier
            logits = clf.predict(images) if shifted is None else clf.predict(images, shifted)
            top1, top5, p_true = topk_predictions(logits, clf.out_to_label, truth)
            rankings[clf.name] = top5
            results[clf.name] = (top1, top5, p_true, [None] * n, [None] * n)
    return [results[c.name] for c in classifiers]
