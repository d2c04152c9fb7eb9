"""Hub artefacts a config names: which are in this machine's caches, and fetching the others.

A config names models by hub id (the SD2 diffusers repository, timm and open_clip
pretrained tags, torch-hub entry points); their libraries download them on first use into
the standard caches (the Hugging Face hub cache, open_clip's and timm's files there or
in the torch-hub checkpoint directory, torch hub's repositories).  :func:`hub_artefacts`
lists every one with whether it is cached here; ``cnsbench validate`` reports the missing
ones and ``cnsbench prefetch`` fetches them through the same libraries, on a node with
internet, so a build can then run offline (``HF_HUB_OFFLINE=1`` or ``TRANSFORMERS_OFFLINE=1``;
``HF_ENDPOINT`` names a mirror, which huggingface_hub's downloads and :func:`offline` use).

A model reference that is neither an existing local path nor a well-formed hub id
(``../../x/y``, ``org/../evil``) is a problem of the config (:func:`hub_id_problems`:
``validate``, ``prefetch``, ``build`` and ``evaluate`` refuse it), never "cached".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

from pipeline.models.classifier_kind import is_hub_id, local_file_ref, model_ref_problem  # noqa: F401 (their home)
from pipeline.registry import CLASSIFIERS

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_model.safetensors", "open_clip_pytorch_model.bin")
# The diffusers components a text-to-image pipeline loads weights for, and their weight files.
_DIFFUSERS_WEIGHTS = {
    "unet": ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin"),
    "vae": ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin"),
    "text_encoder": ("model.safetensors", "pytorch_model.bin"),
}


@dataclass(frozen=True)
class HubArtefact:
    """One downloadable thing a config names: where in the config, the id a user recognises,
    whether it is cached here, and how its library fetches it."""

    where: str  # config key, e.g. "classifiers[3] (resnet50)"
    library: str  # "diffusers", "timm", "open_clip", "torch hub"
    ref: str  # the hub id / tag / entry point
    cached: bool
    fetch: Callable[[], object] = field(compare=False, repr=False)

    def line(self) -> str:
        return f"{self.where}: {self.library} {self.ref}"


# --------------------------------------------------------------------------- hub ids
def hub_id_problems(cfg: "BuildConfig") -> list[str]:
    """One line per model reference of the config that is neither a local path nor a hub id
    (the local files each kind names that may instead be a hub repository: a vlm's ``model``)."""
    problems = []
    for i, clf in enumerate(cfg.classifiers):
        if clf.kind not in CLASSIFIERS.keys():
            continue  # the registry check names it
        for f in CLASSIFIERS.get(clf.kind).local_files(clf):
            problem = model_ref_problem(f.path, f"classifiers[{i}].{f.key} ({clf.name})") if f.or_hub_id else None
            if problem:
                problems.append(problem)
    return problems


# --------------------------------------------------------------------------- cache checks
def _hf_cached(repo_id: str, filenames: Iterable[str]) -> bool:
    from huggingface_hub import try_to_load_from_cache

    for name in filenames:
        try:
            hit = try_to_load_from_cache(repo_id, name)
        except Exception:  # a malformed id (hub_id_problems reports it): not in any cache
            return False
        if isinstance(hit, str):
            return True
    return False


def _hf_download(repo_id: str, filenames: Iterable[str]) -> str:
    """The first of ``filenames`` the repository has, downloaded into the hub cache."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    names = list(filenames)
    for name in names:
        try:
            return hf_hub_download(repo_id, name)
        except EntryNotFoundError:
            continue
    raise FileNotFoundError(f"{repo_id}: none of {', '.join(names)} on the hub")


def _url_cached(url: str) -> bool:
    import torch.hub

    return os.path.isfile(os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(url)))


def _url_download(url: str) -> str:
    import torch.hub

    dst = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(url))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if not os.path.isfile(dst):
        torch.hub.download_url_to_file(url, dst, progress=False)
    return dst


def _diffusers(where: str, repo: str) -> HubArtefact:
    cached = _hf_cached(repo, ("model_index.json",)) and all(
        _hf_cached(repo, [f"{folder}/{name}" for name in names]) for folder, names in _DIFFUSERS_WEIGHTS.items()
    )

    def fetch() -> object:
        from diffusers import DiffusionPipeline

        return DiffusionPipeline.download(repo)  # the files from_pretrained reads, nothing more

    return HubArtefact(where, "diffusers", repo, cached, fetch)


def _hf_repo(where: str, library: str, repo: str) -> HubArtefact:
    """A whole Hugging Face model repository (transformers layout: config.json and its weights)."""
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
    cached = _hf_cached(repo, ("config.json",)) and _hf_cached(repo, weights)

    def fetch() -> object:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo)

    return HubArtefact(where, library, repo, cached, fetch)


def _transformers(where: str, repo: str) -> HubArtefact:
    return _hf_repo(where, "transformers", repo)


def _timm(where: str, name: str) -> HubArtefact | None:
    from timm.models import get_pretrained_cfg

    try:
        pcfg = get_pretrained_cfg(name)
    except Exception:
        pcfg = None
    if pcfg is None or not (pcfg.hf_hub_id or pcfg.url):
        return None  # an unknown tag (check_registry_keys reports it) or nothing to download
    if pcfg.hf_hub_id:
        hub_id = pcfg.hf_hub_id
        return HubArtefact(
            where, "timm", hub_id, _hf_cached(hub_id, _WEIGHT_FILES), lambda: _hf_download(hub_id, _WEIGHT_FILES)
        )
    url = pcfg.url
    return HubArtefact(where, "timm", f"{name} ({url})", _url_cached(url), lambda: _url_download(url))


def _open_clip(where: str, model: str, tag: str) -> HubArtefact | None:
    from open_clip.pretrained import download_pretrained, get_pretrained_cfg

    pcfg = get_pretrained_cfg(model, tag) or {}
    hub = pcfg.get("hf_hub")
    if hub:  # "org/repo/" or "org/repo/filename"
        parts = hub.strip("/").split("/")
        repo, names = "/".join(parts[:2]), (["/".join(parts[2:])] if len(parts) > 2 else [])
        cached = _hf_cached(repo, (*names, *_WEIGHT_FILES))
    elif pcfg.get("url"):  # open_clip keeps URL downloads in ~/.cache/clip
        repo = pcfg["url"]
        cached = os.path.isfile(os.path.join(os.path.expanduser("~/.cache/clip"), os.path.basename(repo)))
    else:
        return None
    return HubArtefact(where, "open_clip", f"{model} pretrained={tag} ({repo})", cached, lambda: download_pretrained(pcfg))


def _torch_hub(where: str, model: str, kwargs: dict) -> HubArtefact:
    import glob

    import torch.hub

    repo, _, entry = model.rpartition(":")
    owner_name = repo.split(":", 1)[0].replace("/", "_")
    cached = bool(glob.glob(os.path.join(torch.hub.get_dir(), f"{owner_name}_*")))
    return HubArtefact(
        where, "torch hub", model, cached, lambda: torch.hub.load(repo, entry, source="github", **kwargs)
    )


# --------------------------------------------------------------------------- the config's artefacts
def hub_artefacts(cfg: "BuildConfig") -> list[HubArtefact]:
    """Every hub artefact the config names (cached or not), in config order."""
    from pipeline.models.diffusion import is_local_path
    from pipeline.registry import FAMILIES

    out: list[HubArtefact | None] = []
    gen = cfg.generator
    families = [FAMILIES.get(g.kind) for g in cfg.family_groups()]
    uses_model = any(f.generates_base for f in families) or cfg.source.kind == "seed"
    if uses_model and not is_local_path(gen.model):
        out.append(_diffusers("generator.model", gen.model))
    flt = cfg.filter
    if flt.enabled and flt.kind != "none":
        if flt.clip.pretrained and not local_file_ref(flt.clip.pretrained):
            out.append(_open_clip("filter.clip", flt.clip.model, flt.clip.pretrained))
        if not flt.dino.checkpoint:
            out.append(_timm("filter.dino", flt.dino.model))
    fetchers = {"timm": _timm, "open_clip": _open_clip, "transformers": _transformers, "torch hub": _torch_hub}
    for i, clf in enumerate(cfg.classifiers):
        if clf.kind not in CLASSIFIERS.keys():
            continue  # the registry check names it
        where = f"classifiers[{i}] ({clf.name})"
        out.extend(fetchers[ref.library](where, *ref.args) for ref in CLASSIFIERS.get(clf.kind).hub_refs(clf))
    return [a for a in out if a is not None]


def remote_weights_not_cached(cfg: "BuildConfig") -> list[str]:
    """One line per hub artefact of the config that is not in this machine's caches."""
    return [a.line() for a in hub_artefacts(cfg) if not a.cached]


_TRUE = ("1", "true", "yes", "on")


def offline() -> bool:
    """Whether hubs may not be asked: offline mode as huggingface_hub reads it (``HF_HUB_OFFLINE``,
    or ``TRANSFORMERS_OFFLINE``, also when set after it was imported), or the hub endpoint
    (``HF_ENDPOINT``, a mirror; default huggingface.co) unreachable."""
    from huggingface_hub import constants, is_offline_mode

    if is_offline_mode() or any(os.environ.get(k, "").strip().lower() in _TRUE
                                for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return True
    return not endpoint_reachable(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)


def endpoint_reachable(url: str, timeout: float = 5.0) -> bool:
    """Whether a TCP connection to ``url``'s host and port (443 for https, 80 for http) opens."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.hostname:
        return False
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError:
        return False
    return True


PREFETCH_HINT = "on a node with internet, fetch them into the standard caches with: cnsbench prefetch {config}"
