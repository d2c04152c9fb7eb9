"""Continuous-shift sampling: one (class, seed) group -> every (shift, scale) image.

Semantics (the reference): prompt ``a picture of a {class token}``, the reference
negative prompt, classifier-free guidance, one ``torch.Generator().manual_seed(seed)``
per image, and the (class, shift) slider at multiplier = scale on both CFG branches
while the timestep is ``<= lora_timestep_threshold`` and off before.

Two facts make most of the reference's per-image work redundant, and
:meth:`SliderSampler.generate_group` exploits both:

* every step before the LoRA window is identical for all shifts and scales of a
  (class, seed), so it runs once (a batch of one, times two for CFG) and every branch
  continues from that latent;
* scale 0 is the same image for every shift, so it is one branch, not one per shift.

The remaining branches -- one per (shift, nonzero scale) -- run together, several per
UNet forward, each row with its own slider and multiplier (``SliderBank.route``: the
sliders stacked per layer, gathered by a per-row slot, so a forward costs the same
whatever the number of distinct sliders in it).

``generator.compile`` compiles the UNet with the slider hooks inside its graph
(:meth:`SliderSampler.compile_unet`); the window's last chunk of a unit is padded to
``branch_batch_size`` so every window forward has the same shapes, and a change of
sliders, multipliers or rows is a change of tensor values, not a new graph.

:meth:`SliderSampler.reference_image` is the plain per-image diffusers loop with a
per-step callback that toggles the slider; it is the oracle in tests and the naive
baseline in ``bench/generation.py``.

The samplers are siblings over one text-to-image base, :class:`TextToImageSampler` (the
pipeline, class tokens, prompt embeddings, the denoising step, decoding, the plain pipeline
call): :class:`SliderSampler` adds the slider bank (its hooks on the UNet's target layers),
:class:`PromptSampler` the shift prompts and no hooks.  :func:`get_sampler` builds the
sampler of a generator kind once per process (:data:`pipeline.registry.SAMPLERS`).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from pipeline.config import GeneratorSpec
from pipeline.errors import CnsbenchError
from pipeline.labels import LabelSpace
from pipeline.models import cache, diffusion
from pipeline.models.lora import SliderBank, load_slider_file
from pipeline.registry import SAMPLERS


@dataclass
class GroupResult:
    """Images of one (class, seed) group, keyed by (shift, scale); scale 0 is keyed (None, 0.0)."""

    images: dict[tuple[str | None, float], "object"]  # PIL images at the saved size
    unet_evals: int = 0  # UNet sample-evaluations (a CFG step on one image counts 2)
    seconds: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)

    def image(self, shift: str, scale: float):
        return self.images[(None, 0.0)] if scale == 0 else self.images[(shift, scale)]


class TextToImageSampler:
    """The text-to-image model of a (class, seed) unit: its sibling kinds differ in what a
    shift does (:class:`SliderSampler`: a LoRA slider; :class:`PromptSampler`: a prompt)."""

    def __init__(self, spec: GeneratorSpec, device: str, dtype) -> None:
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self.pipe = None
        self.tokens: dict[int, str] = {}
        self._embeds: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.compiled = False  # the UNet runs compiled (static shapes: chunks are padded)
        self.cuda_graphs = False  # ... in mode reduce-overhead (CUDA graphs)

    # ------------------------------------------------------------------ setup
    def setup(self, class_ids: list[int], labels: LabelSpace) -> None:
        own_text_encoder = self.spec.class_tokens.kind != "text_encoder_dir"
        self.pipe = diffusion.load_pipeline(self.spec.model, self.dtype, self.device, text_encoder=own_text_encoder)
        self._configure_runtime()
        self.labels = labels
        self.tokens = diffusion.install_class_tokens(self.pipe, self.spec.class_tokens, class_ids, labels)
        self._install()
        if self.spec.compile:
            self.compile_unet()

    def _install(self) -> None:
        """What a kind adds to the pipeline before it is compiled (the slider bank's hooks)."""

    def _configure_runtime(self) -> None:
        """``generator.attention``: ``auto`` and ``sdpa`` keep PyTorch's scaled-dot-product attention
        (diffusers' default), so numbers do not depend on whether xformers happens to be installed;
        ``xformers`` switches to it on CUDA and fails when it is unusable."""
        unet = self.pipe.unet
        if self.spec.attention == "xformers" and self.device.startswith("cuda"):
            try:
                self.pipe.enable_xformers_memory_efficient_attention()
            except Exception as err:
                raise RuntimeError(f"generator.attention=xformers but xformers is unusable: {err}") from err
        if self.spec.channels_last:
            unet.to(memory_format=torch.channels_last)

    def compile_unet(self, backend: Any = "inductor") -> None:
        """Compile the UNet in place, the slider hooks inside its graph (``generator.compile``).

        Shapes are static (``dynamic=False``): the steps before the window (a CFG batch of 2)
        are one graph and the window's chunks, padded to ``branch_batch_size``, another,
        whatever their sliders, multipliers and rows.  The UNet stays the same module
        (``nn.Module.compile``), so the bank's hooks and module paths are unchanged.  On CUDA
        with inductor the mode is ``reduce-overhead`` (CUDA graphs, where torch finds them
        valid) and the bank's stacks are marked static: loading a slider writes into them in
        place.  ``backend`` is any ``torch.compile`` backend.
        """
        cuda = self.device.startswith("cuda")
        self.cuda_graphs = cuda and backend == "inductor"
        if cuda:
            self._mark_static()
        self.pipe.unet.compile(backend=backend, mode="reduce-overhead" if self.cuda_graphs else None, dynamic=False)
        self.compiled = True

    def _mark_static(self) -> None:
        """Tensors a kind writes in place between compiled forwards (the bank's stacks)."""

    def prompt_embeds(self, class_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(negative, positive) text embeddings of a class, each [1, L, D]; cached."""
        if class_id not in self._embeds:
            prompt = self.spec.prompt.format(token=self.tokens[class_id])
            pos, neg = self.pipe.encode_prompt(
                prompt, self.device, 1, True, negative_prompt=self.spec.negative_prompt
            )
            self._embeds[class_id] = (neg, pos)
        return self._embeds[class_id]

    @property
    def do_cfg(self) -> bool:
        return self.spec.guidance_scale > 1.0

    def _timesteps(self):
        sched = copy.deepcopy(self.pipe.scheduler)
        sched.set_timesteps(self.spec.steps, device=self.device)
        return sched

    def _initial_latents(self, seed: int) -> torch.Tensor:
        from diffusers.utils.torch_utils import randn_tensor

        pipe = self.pipe
        shape = (
            1,
            pipe.unet.config.in_channels,
            self.spec.resolution // pipe.vae_scale_factor,
            self.spec.resolution // pipe.vae_scale_factor,
        )
        gen = torch.Generator().manual_seed(seed)
        latents = randn_tensor(shape, generator=gen, device=torch.device(self.device), dtype=pipe.unet.dtype)
        return latents * pipe.scheduler.init_noise_sigma

    def run_unet(self, sample: torch.Tensor, t: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """One UNet forward as the sampler runs it, with the bank's current route."""
        if self.cuda_graphs:  # the previous forward's outputs are consumed: their graph memory may be reused
            torch.compiler.cudagraph_mark_step_begin()
        return self.pipe.unet(sample, t, encoder_hidden_states=embeds, return_dict=False)[0]

    def _step(self, sched, latents, t, neg, pos) -> torch.Tensor:
        """One denoising step for a batch of latents [n, ...] with per-row cond embeds [n, L, D]."""
        n = latents.shape[0]
        if self.do_cfg:
            model_in = torch.cat([latents, latents])
            embeds = torch.cat([neg.expand(n, -1, -1), pos])
        else:
            model_in, embeds = latents, pos
        model_in = sched.scale_model_input(model_in, t)
        out = self.run_unet(model_in, t, embeds)
        self._evals += model_in.shape[0]
        if self.do_cfg:
            uncond, cond = out.chunk(2)
            out = uncond + self.spec.guidance_scale * (cond - uncond)
        return sched.step(out, t, latents, return_dict=False)[0]

    def _decode(self, finals: dict) -> dict:
        keys = list(finals)
        out = {}
        size = max(1, self.spec.branch_batch_size)
        for lo in range(0, len(keys), size):
            part = keys[lo : lo + size]
            lat = torch.cat([finals[k] for k in part])
            pil = self.decode_latents(lat)
            for k, img in zip(part, pil):
                out[k] = img
        return out

    def decode_latents(self, latents: torch.Tensor) -> list:
        """VAE decode with the pipeline's own post-processing, then resize to the saved size."""
        vae = self.pipe.vae
        image = vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]
        pil = self.pipe.image_processor.postprocess(image, output_type="pil", do_denormalize=[True] * len(image))
        return [resize(img, self.spec.image_size) for img in pil]

    # ------------------------------------------------------------------ what a kind defines
    def generate_group(self, class_id: int, seed: int, shifts: list[str], scales: list[float]) -> GroupResult:
        """All images of (class, seed) for ``shifts`` x ``scales``, batched (the kind's fast path)."""
        raise NotImplementedError

    def reference_image(self, class_id: int, seed: int, shift: str | None, scale: float):
        """One image with the plain diffusers pipeline call (the oracle of :meth:`generate_group`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ naive reference
    def _pipeline_call(self, prompt: str, seed: int, callback=None):
        """One image from the plain diffusers pipeline call, resized to the saved size."""
        out = self.pipe(
            prompt,
            negative_prompt=self.spec.negative_prompt,
            num_inference_steps=self.spec.steps,
            guidance_scale=self.spec.guidance_scale,
            height=self.spec.resolution,
            width=self.spec.resolution,
            generator=torch.Generator().manual_seed(seed),
            callback_on_step_end=callback,
        )
        return resize(out.images[0], self.spec.image_size)

    def reference_group(self, class_id: int, seed: int, shifts: list[str], scales: list[float]) -> GroupResult:
        """The naive baseline: one full pipeline call per (shift, scale) image."""
        start = time.perf_counter()
        images = {}
        for shift in shifts:
            for scale in scales:
                images[(shift, scale)] = self.reference_image(class_id, seed, shift, scale)
        images[(None, 0.0)] = images[(shifts[0], 0.0)]
        per_image = self.spec.steps * (2 if self.do_cfg else 1)
        return GroupResult(images, per_image * len(shifts) * len(scales), time.perf_counter() - start)


class SliderSampler(TextToImageSampler):
    """Generator ``slider``: SD2 + class token + one LoRA slider per (class, shift), the sliders
    in a :class:`~pipeline.models.lora.SliderBank` hooked into the UNet's target layers."""

    def __init__(self, spec: GeneratorSpec, device: str, dtype) -> None:
        super().__init__(spec, device, dtype)
        self.bank: SliderBank | None = None

    def _install(self) -> None:
        self.bank = SliderBank(self.pipe.unet, capacity=max(16, self.spec.branch_batch_size))

    def _mark_static(self) -> None:
        self.bank.mark_static()

    @staticmethod
    def slider_name(class_id: int, shift: str) -> str:
        """The bank name of the (class, shift) slider."""
        return f"{shift}/{class_id}"

    def add_slider(self, class_id: int, shift: str, state: dict[str, torch.Tensor]) -> str:
        """Put an in-memory slider (e.g. random weights for a benchmark) in the bank as the
        (class, shift) slider, instead of its file; returns its bank name.  The bank keeps
        ``bank.capacity`` sliders (``bank.reserve`` grows it): one pushed out would be read
        from the slider store when next needed."""
        name = self.slider_name(class_id, shift)
        self.bank.add(name, state, source=f"<in-memory slider {name}>")
        return name

    def load_slider(self, class_id: int, shift: str) -> str:
        """Load the (class, shift) slider into the bank (once); returns its bank name."""
        name = self.slider_name(class_id, shift)
        if name not in self.bank:
            path = diffusion.slider_path(self.spec, class_id, shift, self.labels.name(class_id))
            self.bank.add(name, load_slider_file(path), source=path)
        return name

    # ------------------------------------------------------------------ shared-prefix group
    @torch.inference_mode()
    def generate_group(self, class_id: int, seed: int, shifts: list[str], scales: list[float]) -> GroupResult:
        """All images of (class, seed) for ``shifts`` x ``scales``, sharing prefix and scale 0."""
        start = time.perf_counter()
        self._evals = 0
        neg, pos = self.prompt_embeds(class_id)
        self.bank.reserve(len(shifts))  # every shift of the unit stays loaded while it runs
        sliders = {s: self.load_slider(class_id, s) for s in shifts}
        # Steps before the window: identical for every branch, computed once.
        state = self.pre_window(seed, neg, pos)
        prefix_evals = self._evals
        branches: list[tuple[str | None, float]] = [(None, 0.0)]
        branches += [(shift, scale) for shift in shifts for scale in scales if scale != 0]
        images = self.decode_finals(self.run_branches(state, neg, pos, sliders, branches))
        return GroupResult(
            images=images,
            unet_evals=self._evals,
            seconds=time.perf_counter() - start,
            stats={"prefix_evals": prefix_evals, "branches": len(branches), "window_start": state[2]},
        )

    @property
    def unet_evals(self) -> int:
        """UNet sample-evaluations since the current group (or :meth:`reset_evals`) began."""
        return self._evals

    def reset_evals(self) -> None:
        self._evals = 0

    def pre_window(self, seed: int, neg: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, Any, int]:
        """A (class, seed)'s state where the slider window starts: the latent after the steps
        before it (slider off), the scheduler at that point, and the first window step's index."""
        sched = self._timesteps()
        latents = self._initial_latents(seed)
        self.bank.clear_route()
        first_window = len(sched.timesteps)
        for i, t in enumerate(sched.timesteps):
            if int(t) <= self.spec.lora_timestep_threshold:
                first_window = i
                break
            latents = self._step(sched, latents, t, neg, pos)
        return latents, sched, first_window

    def run_branches(self, state: tuple[torch.Tensor, Any, int], neg: torch.Tensor, pos: torch.Tensor,
                     sliders: dict[str, str], branches: list[tuple[str | None, float]]) -> dict:
        """The final latent of each (shift, multiplier) branch continued from ``state`` (a shift
        of None: no slider), in chunks of ``branch_batch_size``."""
        latents, sched, first_window = state
        timesteps = sched.timesteps
        finals: dict[tuple[str | None, float], torch.Tensor] = {}
        size = self.spec.branch_batch_size
        for lo in range(0, len(branches), size):
            chunk = branches[lo : lo + size]
            n = len(chunk)
            # Compiled: a chunk with sliders is padded to the branch batch (rows without a
            # slider, dropped after), so every window forward has the same shapes.
            pad = size - n if self.compiled and any(s is not None for s, _ in chunk) else 0
            # Each chunk continues from the shared prefix with its own scheduler copy, since
            # schedulers keep per-run counters (and multistep ones a history) across steps.
            csched = copy.deepcopy(sched)
            lat = latents.expand(n + pad, -1, -1, -1).clone()
            rows = [sliders[s] if s is not None else None for s, _ in chunk] + [None] * pad
            mults = [m for _, m in chunk] + [0.0] * pad
            route_rows = rows * 2 if self.do_cfg else rows
            route_mults = mults * 2 if self.do_cfg else mults
            self.bank.route(route_rows, route_mults)
            cond = pos.expand(n + pad, -1, -1)
            for t in timesteps[first_window:]:
                lat = self._step(csched, lat, t, neg, cond)
            self.bank.clear_route()
            for b, key in enumerate(chunk):
                finals[key] = lat[b : b + 1]
        return finals

    def decode_finals(self, finals: dict) -> dict:
        """The images of final latents, decoded in chunks of ``branch_batch_size``."""
        return self._decode(finals)

    # ------------------------------------------------------------------ naive reference
    @torch.inference_mode()
    def reference_image(self, class_id: int, seed: int, shift: str | None, scale: float):
        """One image with the plain diffusers pipeline call, toggling the slider per step.

        The callback runs after step ``i`` and sets the multiplier used by step ``i+1``.
        """
        threshold = self.spec.lora_timestep_threshold
        timesteps = self._timesteps().timesteps
        name = self.load_slider(class_id, shift) if shift is not None and scale != 0 else None
        batch = 2 if self.do_cfg else 1

        def multiplier_for(t) -> float:
            return scale if name is not None and int(t) <= threshold else 0.0

        self.bank.route_uniform(name, multiplier_for(timesteps[0]), batch)

        def toggle(_pipe, i, _t, kwargs):
            if i + 1 < len(timesteps):
                self.bank.route_uniform(name, multiplier_for(timesteps[i + 1]), batch)
            return kwargs

        image = self._pipeline_call(self.spec.prompt.format(token=self.tokens[class_id]), seed, toggle)
        self.bank.clear_route()
        return image


def resize(img, size: int):
    from PIL import Image

    if img.size == (size, size):
        return img
    return img.resize((size, size), Image.BICUBIC)


class PromptSampler(TextToImageSampler):
    """Generator ``prompt``: the prompt-only baseline ("2P") for comparison with sliders.

    Scale 0 is ``generator.prompt`` ("a picture of a {token}"); every nonzero scale is the
    same image generated with ``generator.shift_prompt`` ("a picture of a {token} in
    {shift_words}") from the same seed, over all steps -- a binary shift, so its
    trajectories jump at the first nonzero scale.  No slider bank: the UNet runs unhooked.
    """

    def _shift_embeds(self, class_id: int, shift: str) -> torch.Tensor:
        key = (class_id, shift)
        cache = self.__dict__.setdefault("_shift_cache", {})
        if key not in cache:
            prompt = self.spec.shift_prompt.format(
                token=self.tokens[class_id], shift_words=shift.replace("_", " ")
            )
            pos, _ = self.pipe.encode_prompt(prompt, self.device, 1, True, negative_prompt=self.spec.negative_prompt)
            cache[key] = pos
        return cache[key]

    @torch.inference_mode()
    def generate_group(self, class_id: int, seed: int, shifts: list[str], scales: list[float]) -> GroupResult:
        start = time.perf_counter()
        self._evals = 0
        neg, pos = self.prompt_embeds(class_id)
        sched = self._timesteps()
        latents = self._initial_latents(seed)
        branches: list[str | None] = [None] + list(shifts)
        finals: dict[tuple[str | None, float], torch.Tensor] = {}
        size = self.spec.branch_batch_size
        for lo in range(0, len(branches), size):
            chunk = branches[lo : lo + size]
            pad = size - len(chunk) if self.compiled and len(branches) > 1 else 0  # static shapes
            csched = copy.deepcopy(sched)
            lat = latents.expand(len(chunk) + pad, -1, -1, -1).clone()
            cond = torch.cat([pos if s is None else self._shift_embeds(class_id, s) for s in chunk] + [pos] * pad)
            for t in sched.timesteps:
                lat = self._step(csched, lat, t, neg, cond)
            for b, shift in enumerate(chunk):
                finals[(None, 0.0) if shift is None else (shift, 1.0)] = lat[b : b + 1]
        decoded = self._decode(finals)
        images = {(None, 0.0): decoded[(None, 0.0)]}
        for shift in shifts:
            for scale in scales:
                if scale != 0:
                    images[(shift, scale)] = decoded[(shift, 1.0)]
        return GroupResult(images, self._evals, time.perf_counter() - start, {"branches": len(branches)})

    @torch.inference_mode()
    def reference_image(self, class_id: int, seed: int, shift: str | None, scale: float):
        """One image with the plain diffusers pipeline call and the prompt of its scale."""
        token = self.tokens[class_id]
        if shift is None or scale == 0:
            prompt = self.spec.prompt.format(token=token)
        else:
            prompt = self.spec.shift_prompt.format(token=token, shift_words=shift.replace("_", " "))
        return self._pipeline_call(prompt, seed)


def get_sampler(
    kind: str, spec: GeneratorSpec, classes: Sequence[int], labels: LabelSpace, device: str, dtype: Any
) -> TextToImageSampler:
    """The per-process sampler of ``kind`` for ``spec`` over ``classes``, set up once and shared by
    every family and source that asks for the same one (:func:`pipeline.models.cache.shared`)."""
    if kind not in SAMPLERS.keys():
        raise CnsbenchError(f"generator.kind {kind!r} has no text-to-image sampler; choose one of {SAMPLERS.keys()}")
    key = ("sampler", kind, json.dumps(spec.model_dump(mode="json"), sort_keys=True), tuple(classes),
           labels.key, tuple(labels.names), device, str(dtype))

    def make() -> TextToImageSampler:
        sampler = SAMPLERS.get(kind)(spec, device, dtype)
        sampler.setup(list(classes), labels)
        return sampler

    return cache.shared(key, make)
