"""Concept-slider training: one LoRA per (class, shift), written into a slider store.

Role: produce the ``generator.slider_store`` a build reads -- one file per (class,
shift) in the published concept-slider layout (see :mod:`pipeline.models.lora`) plus a
metadata JSON next to it -- so a benchmark over any classes and shifts can be built
without released sliders.

Objective (the text slider of Gandikota et al. as the CNS-Bench code runs it; see
``REFERENCE.md`` section 1 "Sliders").  Prompts: target = neutral = unconditional = the
class token (``<goldfish-1>``), positive = ``slider_training.positive_prompt``
(``"{token}, in {shift_words}"``).  Each iteration:

1. draw ``k`` and start from pure noise (one seeded generator per slider);
2. run the first ``k`` of ``max_denoise_steps`` DDIM steps with the LoRA on at
   multiplier 1 and classifier-free guidance 7.5, without gradients;
3. at timestep ``t`` predict, LoRA off: neutral, positive, unconditional; LoRA on, with
   gradients: target;
4. ``loss = MSE(target, neutral + eta * (positive - unconditional))`` ("enhance"; "erase"
   uses ``neutral - eta * (...)``), one AdamW step at a constant learning rate.

Two details follow the original code rather than its prose, because the code produced
the published sliders: ``k`` is ``torch.randint(1, max_denoise_steps)``, i.e. uniform on
``1..max_denoise_steps-1`` (after all ``max`` steps no noise level is left to predict
at), and ``t`` is read from the full ``num_train_timesteps`` schedule at index
``int(k * num_train_timesteps / max_denoise_steps)`` (with SD2's schedule that is the
timestep of the last step run, minus the step offset, e.g. 980 after one of 50 steps).
Since the unconditional prompt *is* the target prompt, the guided prediction
``uncond + 7.5 * (cond - uncond)`` equals the conditional one exactly, so the partial
denoising runs one UNet row per step instead of two (the original sliders code uses
guidance 3 there, to the same effect).

The LoRA is peft's: :class:`~pipeline.models.peft_lora.PeftSlider` injects a
``LoraConfig`` over exactly the published slider's layers (``slider_training.targets`` /
``method``; rank and ``lora_alpha`` from the spec) into the frozen UNet, with the
reference initialisation copied in (:func:`init_slider_params`).  "LoRA on" and "LoRA
off" are peft's ``enable_adapters``; the optimiser steps peft's ``lora_A``/``lora_B``
weights, and the trained adapter leaves through ``get_peft_model_state_dict`` renamed to
the published ``lora_unet_*`` layout.  The original layers are put back afterwards.

Public API: :func:`train_slider` (one slider on a loaded pipeline), :class:`SliderTrainer`
(the per-worker state) and the files of a store (:class:`SliderJob`, :func:`plan_slider_jobs`);
every (class, shift) pair of a config, under Ray or in-process and resumable, is
:func:`pipeline.train.run.train_sliders`, ``cnsbench train-sliders`` is
:mod:`pipeline.cli.train_sliders`.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import posixpath
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pipeline.config import BuildConfig, ConfigError, SliderTrainingSpec
from pipeline.errors import CnsbenchError
from pipeline.io.files import exists, is_local, local_path, write_atomic
from pipeline.io.safejson import dumps as strict_dumps
from pipeline.models import diffusion
from pipeline.models.lora import lora_key, save_slider_file, target_modules
from pipeline.runtime.progress import Progress

if TYPE_CHECKING:
    import torch

LOG_PREFIX = "[train-sliders]"
SLIDER_SUFFIXES = (".safetensors", ".pt", ".pth")
# Guidance of the LoRA-on partial denoising (the reference's CFG scale).
TRAIN_GUIDANCE = 7.5
# Progress inside one slider: a line every this many seconds, none for a shorter training.
ITERATION_REPORT_S = 5.0


# --------------------------------------------------------------------------- one slider
def shift_words(shift: str) -> str:
    """The words of a shift in prompts: ``heavy_snow`` -> ``heavy snow``."""
    return shift.replace("_", " ")


def positive_prompt(spec: SliderTrainingSpec, token: str, shift: str) -> str:
    try:
        return spec.positive_prompt.format(token=token, shift_words=shift_words(shift))
    except (KeyError, IndexError) as err:
        raise CnsbenchError(
            f"slider_training.positive_prompt {spec.positive_prompt!r}: unknown placeholder {err}; "
            "allowed: {token}, {shift_words}"
        ) from None


def init_slider_params(
    unet: "torch.nn.Module", spec: SliderTrainingSpec, generator: "torch.Generator", device, dtype
) -> dict[str, "torch.nn.Parameter"]:
    """Fresh LoRA tensors keyed like a published slider state dict: the reference initialisation,
    which :func:`train_slider` copies into the peft adapter.

    ``lora_down`` is kaiming-uniform (``a=1``, as the original ``LoRAModule``), ``lora_up``
    zero, so the slider starts as the identity.  Linear: down ``[rank, in]``, up
    ``[out, rank]``; Conv2d: down ``[rank, in, kh, kw]`` (applied with the layer's own
    stride/padding/dilation by the bank), up ``[out, rank, 1, 1]``.  Initialised on the CPU
    from ``generator`` so a seed gives the same slider on any device.
    """
    import torch
    from torch import nn

    layers = target_modules(unet, spec.targets, spec.method)
    if not layers:
        raise CnsbenchError(
            f"slider_training targets={spec.targets!r} method={spec.method!r} select no layer of this UNet"
        )
    params: dict[str, nn.Parameter] = {}
    for path, layer in layers.items():
        key = lora_key(path)
        if isinstance(layer, nn.Linear):
            down = torch.empty(spec.rank, layer.in_features)
            up = torch.zeros(layer.out_features, spec.rank)
        else:
            if layer.groups != 1:
                raise CnsbenchError(f"slider training: {path} is a grouped Conv2d (groups={layer.groups}); unsupported")
            kh, kw = layer.kernel_size
            down = torch.empty(spec.rank, layer.in_channels, kh, kw)
            up = torch.zeros(layer.out_channels, spec.rank, 1, 1)
        nn.init.kaiming_uniform_(down, a=1, generator=generator)
        params[f"{key}.lora_down.weight"] = nn.Parameter(down.to(device, dtype))
        params[f"{key}.lora_up.weight"] = nn.Parameter(up.to(device, dtype))
    return params


def train_slider(
    pipe,
    class_token: str,
    shift: str,
    spec: SliderTrainingSpec,
    device: "str | torch.device",
    seed: int,
    *,
    resolution: int | None = None,
    guidance_scale: float = TRAIN_GUIDANCE,
    on_iteration: Callable[[float], None] | None = None,
) -> tuple[dict[str, "torch.Tensor"], list[float]]:
    """Train one text slider for ``shift`` on ``class_token``; returns (state dict, losses).

    ``pipe`` is a loaded ``StableDiffusionPipeline`` on ``device`` with the class token
    installed; its dtype is the training dtype (bf16 on GPU, float32 on CPU -- the caller
    loads it so).  Its UNet is frozen (``requires_grad_(False)``) and left so; the peft LoRA
    layers are injected for the run and removed before returning, so the pipeline is
    otherwise unchanged.  ``resolution`` (pixels) defaults to the UNet's native size.

    The state dict has CPU float32 tensors in the published key layout
    (``lora_unet_<path>.lora_down.weight`` / ``.lora_up.weight`` / ``.alpha``), loadable by
    :meth:`SliderBank.add` and, after :func:`save_slider_file`, by ``load_slider_file``.
    ``losses`` has one value per iteration.  Same seed, same pipeline, same device: same
    slider.  ``on_iteration(loss)`` is called after every iteration (progress).
    """
    import torch
    import torch.nn.functional as F
    from diffusers import DDIMScheduler
    from diffusers.utils.torch_utils import randn_tensor

    from pipeline.models.peft_lora import PeftSlider

    dev = torch.device(device)
    unet = pipe.unet
    if unet.device.type != dev.type:
        raise CnsbenchError(f"train_slider: the pipeline's UNet is on {unet.device}, training was asked on {dev}")
    dtype = unet.dtype
    vae_factor = pipe.vae_scale_factor
    res = resolution or unet.config.sample_size * vae_factor
    if res % vae_factor:
        raise CnsbenchError(f"train_slider: resolution {res} is not a multiple of the VAE factor {vae_factor}")
    sched_config = pipe.scheduler.config
    if sched_config.get("prediction_type") not in ("epsilon", "v_prediction"):
        raise CnsbenchError(f"train_slider: unsupported scheduler prediction_type {sched_config.get('prediction_type')!r}")
    max_steps = spec.max_denoise_steps
    num_train = int(sched_config["num_train_timesteps"])

    # Only the LoRA learns; without this autograd would also keep and fill UNet weight grads.
    unet.requires_grad_(False)
    unet.eval()

    gen = torch.Generator().manual_seed(seed)
    init = init_slider_params(unet, spec, gen, dev, dtype)

    # Prompt embeddings, each distinct prompt encoded once ([1, L, D]).
    token = class_token
    prompts = {
        "target": token,
        "neutral": token,
        "unconditional": token,
        "positive": positive_prompt(spec, token, shift),
    }
    with torch.no_grad():
        encoded = {p: pipe.encode_prompt(p, dev, 1, False)[0] for p in set(prompts.values())}
    emb = {role: encoded[p] for role, p in prompts.items()}
    # LoRA-off predictions needed per iteration: distinct prompts among neutral/positive/unconditional.
    off_prompts = sorted({prompts["neutral"], prompts["positive"], prompts["unconditional"]})
    off_embeds = torch.cat([encoded[p] for p in off_prompts])
    # With unconditional == target (the reference's prompts) CFG returns the conditional
    # prediction exactly -- uncond + g * (cond - uncond) with cond == uncond -- so one
    # UNet row per denoising step suffices instead of two.
    cfg_needed = prompts["unconditional"] != prompts["target"] and guidance_scale != 1.0
    denoise_embeds = torch.cat([emb["unconditional"], emb["target"]]) if cfg_needed else emb["target"]

    sched = DDIMScheduler.from_config(sched_config)
    full = DDIMScheduler.from_config(sched_config)
    full.set_timesteps(num_train)  # the reference reads t from the full schedule
    # batch_size latents per iteration (the original trains with 16), all at the same timestep.
    batch = spec.batch_size
    latent_shape = (batch, unet.config.in_channels, res // vae_factor, res // vae_factor)

    slider = PeftSlider(unet, spec.rank, spec.alpha, spec.targets, spec.method)
    try:
        slider.load_published(init)
        params = slider.parameters()  # peft's lora_A / lora_B weights, keyed like the published layout
        slider.enable(False)
        optimizer = torch.optim.AdamW(list(params.values()), lr=spec.learning_rate)
        losses: list[float] = []
        for it in range(spec.iterations):
            k = int(torch.randint(1, max_steps, (1,), generator=gen)) if max_steps > 1 else 0
            latents = randn_tensor(latent_shape, generator=gen, device=dev, dtype=dtype)
            with torch.no_grad():
                sched.set_timesteps(max_steps, device=dev)
                latents = latents * sched.init_noise_sigma
                rows_embeds = denoise_embeds.repeat_interleave(batch, dim=0)  # [e0 x batch, e1 x batch]
                slider.enable(True)
                for t in sched.timesteps[:k]:
                    model_in = sched.scale_model_input(torch.cat([latents] * denoise_embeds.shape[0]), t)
                    out = unet(model_in, t, encoder_hidden_states=rows_embeds, return_dict=False)[0]
                    if cfg_needed:
                        uncond, cond = out.chunk(2)
                        out = uncond + guidance_scale * (cond - uncond)
                    latents = sched.step(out, t, latents, return_dict=False)[0]
                slider.enable(False)

                t = full.timesteps[min(int(k * num_train / max_steps), len(full.timesteps) - 1)].to(dev)
                n_off = off_embeds.shape[0]
                off_in = sched.scale_model_input(torch.cat([latents] * n_off), t)
                off_rows = off_embeds.repeat_interleave(batch, dim=0)
                off = unet(off_in, t, encoder_hidden_states=off_rows, return_dict=False)[0]
                pred = {p: off[i * batch : (i + 1) * batch] for i, p in enumerate(off_prompts)}
                neutral = pred[prompts["neutral"]]
                direction = pred[prompts["positive"]] - pred[prompts["unconditional"]]
                goal = neutral + spec.eta * direction if spec.mode == "enhance" else neutral - spec.eta * direction

            # LoRA on for the target; it stays on through backward, since peft's "off" also
            # clears requires_grad on the adapter, which would drop the gradients just built.
            slider.enable(True)
            target_in = sched.scale_model_input(latents, t)
            target_rows = emb["target"].expand(batch, -1, -1)
            target = unet(target_in, t, encoder_hidden_states=target_rows, return_dict=False)[0]
            # The loss in float32: a bf16 mean over a 96x96x4 latent loses the small late-training values.
            loss = F.mse_loss(target.float(), goal.float())
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"train_slider {shift}/{class_token}: loss is {loss.item()} at iteration {it} (k={k}, t={int(t)})"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            if on_iteration is not None:
                on_iteration(losses[-1])
        state = slider.state_dict()
    finally:
        slider.remove()

    return state, losses


# --------------------------------------------------------------------------- files of a store
@dataclass(frozen=True)
class SliderJob:
    """One (class, shift) slider to train and where it goes."""

    class_id: int
    class_name: str
    shift: str
    path: str  # slider file
    meta_path: str  # metadata JSON, written last (the done-marker)
    seed: int

    @property
    def label(self) -> str:
        return f"{self.shift}/{self.class_id:03d}_{self.class_name}"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def metadata_path(slider_file: str) -> str:
    """``<store>/painting_style/022.safetensors`` -> ``<store>/painting_style/022.json``."""
    return posixpath.splitext(slider_file)[0] + ".json"


def pair_seed(base_seed: int, class_id: int, shift: str) -> int:
    """Training seed of a (class, shift): a function of its coordinates, never of run order."""
    digest = hashlib.sha256(f"{base_seed}/{shift}/{class_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**63)


def plan_slider_jobs(cfg: BuildConfig, store: str) -> list[SliderJob]:
    """Every (class, shift) pair of ``cfg.benchmark``, shift-major, with its files in ``store``."""
    pattern = cfg.generator.slider_pattern
    if not pattern.endswith(SLIDER_SUFFIXES):
        raise ConfigError(
            f"generator.slider_pattern {pattern!r} must end with one of {SLIDER_SUFFIXES} to train sliders into it"
        )
    spec = cfg.generator.model_copy(update={"slider_store": store})
    bench = cfg.benchmark
    jobs = []
    for shift in bench.shifts:
        for class_id in bench.classes:
            name = bench.class_name(class_id)
            path = diffusion.slider_path(spec, class_id, shift, name)
            seed = pair_seed(cfg.slider_training.seed, class_id, shift)
            jobs.append(SliderJob(class_id, name, shift, path, metadata_path(path), seed))
    return jobs


def missing_training_assets(cfg: BuildConfig) -> list[str]:
    """The files slider training loads that are missing (base model, class tokens), one line each."""
    gen = cfg.generator
    missing = []
    if diffusion.is_local_path(gen.model) and not os.path.isfile(os.path.join(gen.model, "model_index.json")):
        missing.append(f"generator.model: no diffusers model at {gen.model} (model_index.json missing)")
    for f in diffusion.class_token_files(gen.class_tokens, list(cfg.benchmark.classes)):
        if not os.path.exists(f):
            missing.append(f"generator.class_tokens: {f}")
    return missing


def is_done(job: SliderJob) -> bool:
    """A slider counts as trained once its file and its metadata JSON (written last) exist."""
    return exists(job.path) and exists(job.meta_path)


def write_slider(state: dict[str, "torch.Tensor"], path: str, header: dict[str, str] | None = None) -> None:
    """Write a slider file atomically: locally via ``save_slider_file``, else as one object PUT."""
    if is_local(path):
        save_slider_file(state, local_path(path), metadata=header)
        return
    import io

    import torch

    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    if path.endswith(".safetensors"):
        from safetensors.torch import save

        data = save(state, metadata=header)
    else:
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
    write_atomic(path, data)


def _unet_weight_files(unet_dir: Path) -> list[Path]:
    """The UNet weights ``from_pretrained`` loads without a ``variant``: one file or its shards.

    Variant files (``*.fp16.safetensors``) that a hub cache may also hold are left out, so
    the hash does not depend on what else happens to be cached.
    """
    for ext in (".safetensors", ".bin"):
        single = unet_dir / f"diffusion_pytorch_model{ext}"
        if single.is_file():
            return [single]
        shards = sorted(unet_dir.glob(f"diffusion_pytorch_model-*-of-*{ext}"))
        if shards:
            return shards
    return []


@functools.lru_cache(maxsize=8)
def base_model_fingerprint(model: str) -> dict[str, str | None]:
    """Identity of the base model a slider was trained on, for the metadata JSON.

    SHA-256 over the UNet's ``config.json`` and weight file(s) (a slider is a delta on
    the UNet) of the local model directory, or of the hub snapshot in the local cache
    (``base_model_revision`` is then the snapshot's commit); when no snapshot is cached,
    the hash of ``hub id@revision``.  ``hash_of`` says which.  Cached per process:
    hashing SD2's UNet reads 3.5 GB.
    """
    root: Path | None = None
    revision: str | None = None
    if diffusion.is_local_path(model):
        root = Path(model)
    else:
        try:
            from huggingface_hub import snapshot_download

            root = Path(snapshot_download(model, allow_patterns=["unet/*"], local_files_only=True))
            revision = root.name  # snapshot folders are named by commit hash
        except Exception:  # not in the local cache: identify by name only
            root = None
    config = root / "unet" / "config.json" if root is not None else None
    weights = _unet_weight_files(root / "unet") if root is not None else []
    h = hashlib.sha256()
    if config is not None and config.is_file() and weights:
        for f in [config, *weights]:
            h.update(f.name.encode() + b"\0")
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 24), b""):
                    h.update(chunk)
        hash_of = "unet config + weights"
    else:
        h.update(f"{model}@{revision or 'main'}".encode())
        hash_of = "hub id@revision"
    return {
        "base_model": model,
        "base_model_hash": f"sha256:{h.hexdigest()}",
        "base_model_revision": revision,
        "hash_of": hash_of,
    }


# --------------------------------------------------------------------------- worker
def _print_above_live_line(line: str) -> None:
    """A progress line on stdout; on a terminal it first clears the command's live line."""
    out = sys.stdout
    out.write(("\r\x1b[K" if out.isatty() else "") + line + "\n")
    out.flush()


class SliderTrainer:
    """Per-worker state: loads the pipeline and class tokens once, then trains and writes jobs.

    ``__init__`` only stores the config (cheap to pickle into a Ray actor); the model loads
    on the first :meth:`train`.  A job is retry-safe: files are written atomically to
    deterministic paths, the metadata JSON last.
    """

    def __init__(
        self, config: BuildConfig | dict[str, Any], store: str, device: str | None = None, threads: int | None = None
    ) -> None:
        self.cfg = config if isinstance(config, BuildConfig) else BuildConfig.model_validate(config)
        self.store = store
        self.device_override = device
        self.threads = threads
        self.pipe = None
        self.tokens: dict[int, str] = {}

    def setup(self) -> None:
        import torch

        from pipeline.stages.base import pick_device, pick_dtype

        if self.threads:
            torch.set_num_threads(self.threads)
        cfg = self.cfg
        self.device = pick_device(self.device_override)
        dtype = pick_dtype(cfg.slider_training.dtype, self.device)
        self.pipe = diffusion.load_pipeline(cfg.generator.model, dtype, self.device)
        bench = cfg.benchmark
        self.tokens = diffusion.install_class_tokens(
            self.pipe, cfg.generator.class_tokens, list(bench.classes), bench.label_space
        )
        self.fingerprint = base_model_fingerprint(cfg.generator.model)

    def train(self, job: SliderJob | dict[str, Any]) -> dict[str, Any]:
        """Train one slider and write it plus its metadata; returns a small result record."""
        if isinstance(job, dict):
            job = SliderJob(**job)
        if self.pipe is None:
            self.setup()
        spec = self.cfg.slider_training
        token = self.tokens[job.class_id]
        start = time.perf_counter()
        # slider_training.resolution: 512 under the cns protocol (the original trains at 512 and
        # generates at 768), generator.resolution otherwise.
        resolution = spec.resolution or self.cfg.generator.resolution
        progress = Progress(
            f"slider {job.label}", spec.iterations, unit="iterations", echo=_print_above_live_line,
            interval=ITERATION_REPORT_S, first_after=ITERATION_REPORT_S, rate=True, failures=False,
        )
        state, losses = train_slider(
            self.pipe, token, job.shift, spec, self.device, job.seed, resolution=resolution,
            on_iteration=lambda _loss: progress.advance(),
        )
        seconds = time.perf_counter() - start
        meta: dict[str, Any] = {
            "class_id": job.class_id,
            "class_name": job.class_name,
            "shift": job.shift,
            "token": token,
            "positive_prompt": positive_prompt(spec, token, job.shift),
            "rank": spec.rank,
            "alpha": spec.alpha,
            "targets": spec.targets,
            "method": spec.method,
            "mode": spec.mode,
            "eta": spec.eta,
            "iterations": spec.iterations,
            "learning_rate": spec.learning_rate,
            "max_denoise_steps": spec.max_denoise_steps,
            "guidance_scale": TRAIN_GUIDANCE,
            "resolution": resolution,
            "batch_size": spec.batch_size,
            "seed": job.seed,
            "dtype": str(self.pipe.unet.dtype).replace("torch.", ""),
            "device": self.device,
            "layers": sum(1 for k in state if k.endswith(".alpha")),
            "final_loss": losses[-1],
            "mean_loss_last_10": sum(losses[-10:]) / len(losses[-10:]),
            "seconds": round(seconds, 3),
            **self.fingerprint,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "file": posixpath.basename(job.path),
        }
        header = {k: str(meta[k]) for k in ("class_id", "shift", "rank", "alpha", "targets", "method", "base_model")}
        write_slider(state, job.path, header)
        # Written after the weights: its presence says the slider file is complete.
        write_atomic(job.meta_path, (strict_dumps(meta, indent=1, sort_keys=True) + "\n").encode())
        return {"job": job.to_dict(), "final_loss": meta["final_loss"], "seconds": seconds, "path": job.path}
