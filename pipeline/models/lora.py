"""LoRA concept sliders on a diffusers UNet, with a per-row slider and multiplier.

A slider is a LoRA network in the published concept-slider layout: a state dict with
``lora_unet_<module path, '.' -> '_'>.lora_down.weight`` / ``.lora_up.weight`` /
``.alpha`` for every targeted Linear or Conv2d.  Its output is
``lora_up(lora_down(x)) * multiplier * alpha / rank`` added to the layer's output.

:class:`SliderBank` attaches forward hooks to the targeted layers once and keeps the
loaded sliders stacked per layer (one slot each, padded to the largest rank, slot 0
empty).  Before each UNet call, :meth:`SliderBank.route` says which slider and which
multiplier each batch row uses, so one forward can carry several (shift, scale) branches
of a trajectory group -- the reference applies one slider at one multiplier per pipeline
call, which is the special case of a uniform route.  A layer applies every row's slider
at once (:func:`apply_linear`, :func:`apply_conv`), in the same ops whatever the number of
distinct sliders, and inside a compiled UNet's graph.

Training builds the same layout with peft (:mod:`pipeline.models.peft_lora`), and
diffusers' ``load_lora_weights`` reads these files as they are (``docs/lora.md``).
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.errors import CnsbenchError, UnknownKey

LORA_PREFIX = "lora_unet"

# Module classes whose Linear/Conv children a slider adapts (concept-slider naming).
TARGETS = {
    "attn": ("Attention",),
    # "c3lier": attention plus the convolutions of the resnet and up/down blocks.
    "attn_conv": ("Attention", "ResnetBlock2D", "Downsample2D", "Upsample2D", "DownBlock2D", "UpBlock2D"),
}
METHODS = ("noxattn", "full", "xattn", "selfattn")


def lora_key(module_path: str) -> str:
    return f"{LORA_PREFIX}_{module_path.replace('.', '_')}"


def _excluded(key: str, method: str) -> bool:
    if method == "noxattn":
        return "attn2" in key or "time_embed" in key
    if method == "xattn":
        return "attn2" not in key
    if method == "selfattn":
        return "attn1" not in key
    return False


def target_modules(unet: nn.Module, targets: str = "attn", method: str = "noxattn") -> dict[str, nn.Module]:
    """Module path -> Linear/Conv2d layer that a slider with these settings adapts."""
    if targets not in TARGETS:
        raise CnsbenchError(f"unknown slider targets {targets!r}; choose one of {sorted(TARGETS)}")
    if method not in METHODS:
        raise CnsbenchError(f"unknown slider method {method!r}; choose one of {METHODS}")
    classes = TARGETS[targets]
    found: dict[str, nn.Module] = {}
    for name, module in unet.named_modules():
        if module.__class__.__name__ not in classes:
            continue
        for child_name, child in module.named_modules():
            if not isinstance(child, (nn.Linear, nn.Conv2d)) or not child_name:
                continue
            parts = child_name.split(".")
            if any(p.startswith("lora_") for p in parts):
                continue  # a peft adapter's own A/B layers
            # A layer wrapped by peft (``to_q.base_layer``) keeps its slider key (``to_q``).
            path = f"{name}.{'.'.join(p for p in parts if p != 'base_layer')}"
            if not _excluded(lora_key(path), method):
                found[path] = child
    return dict(sorted(found.items()))


def load_slider_file(path: str) -> dict[str, torch.Tensor]:
    """Read a slider state dict from ``.safetensors`` or ``.pt`` (local path or fsspec URI)."""
    import fsspec

    if not (path.endswith(".safetensors") or path.endswith(".pt") or path.endswith(".pth")):
        raise CnsbenchError(f"slider file {path!r}: expected a .safetensors, .pt or .pth file")
    try:
        with fsspec.open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"slider file not found: {path}") from None
    if path.endswith(".safetensors"):
        from safetensors.torch import load as st_load

        return st_load(data)
    import io

    from pipeline.io import zip_archive

    if data.startswith(zip_archive.LOCAL_HEADER):  # torch.save's zip: one copy per member, as checked
        data = zip_archive.rebuild(zip_archive.read_members(data, path))
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise CnsbenchError(f"slider file {path!r}: expected a state dict, got {type(state).__name__}")
    return state


def save_slider_file(state: dict[str, torch.Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write a slider atomically (temporary file, then rename) as safetensors or .pt."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    if path.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(state, tmp, metadata=metadata)
    else:
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
    os.replace(tmp, path)


def random_slider(
    unet: nn.Module,
    rank: int = 4,
    alpha: float = 1.0,
    targets: str = "attn",
    method: str = "noxattn",
    seed: int = 0,
    std: float = 0.05,
) -> dict[str, torch.Tensor]:
    """A slider with random non-zero weights (a freshly initialised slider has ``lora_up = 0``
    and changes nothing; tests and the demo need one that provably moves the output)."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for path, layer in target_modules(unet, targets, method).items():
        key = lora_key(path)
        if isinstance(layer, nn.Linear):
            down = torch.randn(rank, layer.in_features, generator=gen) * std
            up = torch.randn(layer.out_features, rank, generator=gen) * std
        else:
            kh, kw = layer.kernel_size
            down = torch.randn(rank, layer.in_channels, kh, kw, generator=gen) * std
            up = torch.randn(layer.out_channels, rank, 1, 1, generator=gen) * std
        state[f"{key}.lora_down.weight"] = down
        state[f"{key}.lora_up.weight"] = up
        state[f"{key}.alpha"] = torch.tensor(float(alpha))
    return state


class _LayerStack:
    """The loaded sliders' weights for one adapted layer, stacked by slot (slot 0: no slider).

    Linear: ``down`` [slots, in, R], ``up`` [slots, R, out] (transposed for ``bmm``).
    Conv2d: ``down`` [slots * R, in, kh, kw] (slot ``s`` owns rows ``s*R .. s*R+R-1``, the
    weight of a grouped convolution), ``up`` [slots, out, R].  ``R`` is the bank's padded
    rank; a slider of lower rank fills the first ranks and leaves zeros, so the padding
    adds exact zeros.  ``alpha / rank`` is folded into ``up``.
    """

    def __init__(self, layer: nn.Module) -> None:
        self.is_conv = isinstance(layer, nn.Conv2d)
        if self.is_conv:
            self.in_dim, self.out_dim = layer.in_channels, layer.out_channels
            self.kernel: tuple[int, ...] = tuple(layer.kernel_size)
        else:
            self.in_dim, self.out_dim, self.kernel = layer.in_features, layer.out_features, ()
        self.down: torch.Tensor | None = None
        self.up: torch.Tensor | None = None

    def down_shape(self, rank: int) -> tuple[int, ...]:
        return (rank, self.in_dim, *self.kernel)

    def allocate(self, slots: int, rank: int, like: torch.Tensor) -> None:
        """(Re)allocate for ``slots`` slots of padded rank ``rank``, keeping what is stored."""
        old_down, old_up = self.down, self.up
        if self.is_conv:
            down = like.new_zeros(slots, rank, self.in_dim, *self.kernel)
            up = like.new_zeros(slots, self.out_dim, rank)
            if old_up is not None:
                s, r = old_up.shape[0], old_up.shape[2]
                down[:s, :r] = old_down.view(s, r, self.in_dim, *self.kernel)
                up[:s, :, :r] = old_up
            self.down = down.view(slots * rank, self.in_dim, *self.kernel)
        else:
            down = like.new_zeros(slots, self.in_dim, rank)
            up = like.new_zeros(slots, rank, self.out_dim)
            if old_up is not None:
                s, r = old_up.shape[0], old_up.shape[1]
                down[:s, :, :r] = old_down
                up[:s, :r] = old_up
            self.down = down
        self.up = up

    def clear(self, slot: int) -> None:
        if self.up is None:
            return
        if self.is_conv:
            rank = self.up.shape[2]
            self.down[slot * rank : (slot + 1) * rank].zero_()
        else:
            self.down[slot].zero_()
        self.up[slot].zero_()

    def write(self, slot: int, down: torch.Tensor, up: torch.Tensor, scale: float) -> None:
        """Store one slider's layer in ``slot`` (which :meth:`clear` has zeroed)."""
        r = down.shape[0]
        up = (up.float() * scale).to(self.up.dtype)  # alpha / rank folded in once, at load
        if self.is_conv:
            rank = self.up.shape[2]
            self.down[slot * rank : slot * rank + r] = down
            self.up[slot, :, :r] = up.flatten(1)
        else:
            self.down[slot, :, :r] = down.t()
            self.up[slot, :r] = up.t()

    def tensors(self) -> list[torch.Tensor]:
        return [] if self.up is None else [self.down, self.up]


class SliderBank:
    """Loaded sliders of one UNet, stacked per layer, applied per batch row through hooks.

    Every loaded slider owns a slot; each adapted layer keeps the down/up weights of all
    slots in one tensor each (:class:`_LayerStack`), built when the slider is added.  A
    route gives every batch row a slot (0: no slider) and a multiplier, as tensors; a
    layer's hook then gathers each row's weights by its slot and adds
    ``up(down(x)) * multiplier`` in place -- ``bmm`` for a Linear, a grouped convolution
    and a ``bmm`` for a Conv2d.  The ops per layer are the same whatever the number of
    distinct sliders in the batch, and a change of route changes tensor values only, so a
    compiled UNet keeps its graph.  A row without a slider or at multiplier 0 gathers the
    zero slot and adds exact zeros.

    ``capacity`` slots are kept; adding a slider to a full bank replaces the least recently
    added or routed slider that the current route does not use (the caller reloads it if it
    comes back), so memory stays bounded over a build.  :meth:`reserve` grows the bank.
    Growing (capacity, or the padded rank when a slider of a higher rank comes) reallocates
    the stacks, which a compiled UNet sees as new inputs: it recompiles once.
    """

    def __init__(self, unet: nn.Module, capacity: int = 16) -> None:
        if capacity < 1:
            raise CnsbenchError(f"slider bank capacity must be >= 1, got {capacity}")
        self.unet = unet
        # Every Linear/Conv2d that any slider could target, by LoRA key.
        self._layers: dict[str, tuple[str, nn.Module]] = {}
        for targets in TARGETS:
            for path, layer in target_modules(unet, targets, "full").items():
                self._layers[lora_key(path)] = (path, layer)
        self._stacks = {key: _LayerStack(layer) for key, (_, layer) in self._layers.items()}
        self._capacity = capacity
        self._rank = 0  # padded rank of every stack; 0 until a slider is added
        self._slots: dict[str, int] = {}
        self._used: dict[str, int] = {}  # name -> tick of its last add or route (least recent goes first)
        self._tick = 0
        self._static = False
        self._routed: tuple[list, list] | None = None
        self._active = False
        self._index: torch.Tensor | None = None  # [B] slot per row
        self._index_r: torch.Tensor | None = None  # [B * R] the rows' slots' rank rows (grouped conv)
        self._mult: torch.Tensor | None = None  # [B, 1, 1] multiplier per row
        self._hooks = [
            layer.register_forward_hook(self._make_hook(key)) for key, (_, layer) in self._layers.items()
        ]

    # ------------------------------------------------------------------ sliders
    def __contains__(self, name: str) -> bool:
        return name in self._slots

    def names(self) -> list[str]:
        return list(self._slots)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def rank(self) -> int:
        """The padded rank of the stacks (the largest rank of any slider added so far)."""
        return self._rank

    @property
    def nbytes(self) -> int:
        """Bytes of the stacked slider weights."""
        return sum(t.numel() * t.element_size() for s in self._stacks.values() for t in s.tensors())

    def reserve(self, slots: int) -> None:
        """Make room for at least ``slots`` sliders at once (a unit's shifts must all fit)."""
        if slots > self._capacity:
            self._resize(max(slots, 2 * self._capacity), self._rank)

    def add(self, name: str, state: dict[str, torch.Tensor], source: str = "<state dict>") -> None:
        """Load a slider state dict under ``name`` into a slot; unknown modules are an error.

        Everything is checked before the bank changes, so a bad slider leaves it as it was.
        """
        grouped: dict[str, dict[str, torch.Tensor]] = {}
        for k, v in state.items():
            base, _, leaf = k.rpartition(".")
            if leaf == "weight":
                base, _, kind = base.rpartition(".")
                leaf = kind
            grouped.setdefault(base, {})[leaf] = v
        unknown = sorted(k for k in grouped if k not in self._layers)
        if unknown:
            raise CnsbenchError(
                f"slider {source}: {len(unknown)} keys match no UNet module, e.g. {unknown[:3]}; "
                "is it a slider for this base model?"
            )
        layers: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}
        for key, parts in grouped.items():
            if "lora_down" not in parts or "lora_up" not in parts:
                raise CnsbenchError(f"slider {source}: {key} lacks lora_down/lora_up weights")
            down, up = parts["lora_down"], parts["lora_up"]
            stack = self._stacks[key]
            rank = down.shape[0] if down.dim() else 0
            if stack.is_conv and down.dim() != 4:
                raise CnsbenchError(f"slider {source}: {key} is a Conv2d but lora_down has shape {tuple(down.shape)}")
            want_up = (stack.out_dim, rank, 1, 1) if stack.is_conv else (stack.out_dim, rank)
            if rank < 1 or tuple(down.shape) != stack.down_shape(rank) or tuple(up.shape) != want_up:
                raise CnsbenchError(
                    f"slider {source}: {key} has lora_down {tuple(down.shape)} and lora_up {tuple(up.shape)}; "
                    f"the layer needs [r, {', '.join(map(str, stack.down_shape(rank)[1:]))}] and {list(want_up)}"
                )
            alpha = float(parts["alpha"]) if "alpha" in parts else float(rank)
            layers[key] = (down, up, alpha / rank)

        slot = self._slots.get(name) or self._free_slot()
        rank = max([self._rank, *(d.shape[0] for d, _, _ in layers.values())])
        if rank > self._rank:
            self._resize(self._capacity, rank)
        like = next(self.unet.parameters())
        for key in layers:
            if self._stacks[key].up is None:
                self._allocate(self._stacks[key], like)
        for stack in self._stacks.values():
            stack.clear(slot)
        for key, (down, up, scale) in layers.items():
            self._stacks[key].write(slot, down.to(like.device, like.dtype), up.to(like.device), scale)
        self._slots[name] = slot
        self._touch(name)

    def remove(self, name: str) -> None:
        """Forget a slider; its slot is free for the next one."""
        self._slots.pop(name, None)
        self._used.pop(name, None)

    def detach(self) -> None:
        """Remove the hooks and free the stacks; the UNet is as before."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for stack in self._stacks.values():
            stack.down = stack.up = None
        self._slots.clear()
        self._used.clear()
        self.clear_route()

    def mark_static(self) -> None:
        """Tell ``torch.compile`` that the stacks keep their storage (CUDA graphs reuse it):
        loading a slider writes into them in place."""
        self._static = True
        for stack in self._stacks.values():
            for t in stack.tensors():
                torch._dynamo.mark_static_address(t)

    def _touch(self, name: str) -> None:
        self._tick += 1
        self._used[name] = self._tick

    def _free_slot(self) -> int:
        taken = set(self._slots.values())
        free = [s for s in range(1, self._capacity + 1) if s not in taken]
        if free:
            return free[0]
        routed = set(self._routed[0]) if self._routed else set()
        evictable = [n for n in self._slots if n not in routed]
        if not evictable:
            self._resize(2 * self._capacity, self._rank)
            return self._capacity // 2 + 1
        oldest = min(evictable, key=lambda n: self._used[n])
        self._used.pop(oldest, None)
        return self._slots.pop(oldest)

    def _allocate(self, stack: _LayerStack, like: torch.Tensor) -> None:
        stack.allocate(self._capacity + 1, max(self._rank, 1), like)
        if self._static:
            for t in stack.tensors():
                torch._dynamo.mark_static_address(t)

    def _resize(self, capacity: int, rank: int) -> None:
        self._capacity, self._rank = capacity, rank
        like = next(self.unet.parameters())
        for stack in self._stacks.values():
            if stack.up is not None:
                self._allocate(stack, like)
        if self._routed is not None:
            self.route(*self._routed)  # the conv rows depend on the padded rank

    # ------------------------------------------------------------------ routing
    def route(self, sliders: Sequence[str | None], multipliers: Sequence[float]) -> None:
        """Set slider and multiplier per batch row for the following UNet calls.

        ``sliders[i] is None`` or ``multipliers[i] == 0`` leaves row ``i`` untouched.
        """
        if len(sliders) != len(multipliers):
            raise CnsbenchError("route: sliders and multipliers differ in length")
        on = [s is not None and m != 0 for s, m in zip(sliders, multipliers)]
        missing = sorted({s for s, o in zip(sliders, on) if o and s not in self._slots})
        if missing:
            raise UnknownKey(f"slider {missing[0]!r} is not loaded; loaded: {self.names()}")
        if not any(on):
            self.clear_route()
            return
        for s in {s for s, o in zip(sliders, on) if o}:
            self._touch(s)
        param = next(self.unet.parameters())
        index = torch.tensor([self._slots[s] if o else 0 for s, o in zip(sliders, on)], device=param.device)
        mult = torch.tensor([float(m) if o else 0.0 for m, o in zip(multipliers, on)], dtype=param.dtype)
        rank = max(self._rank, 1)
        self._index = index
        self._index_r = (index[:, None] * rank + torch.arange(rank, device=param.device)).flatten()
        self._mult = mult.to(param.device).view(-1, 1, 1)
        self._routed = (list(sliders), list(multipliers))
        self._active = True

    def route_uniform(self, name: str | None, multiplier: float, batch: int) -> None:
        self.route([name] * batch, [multiplier] * batch)

    def clear_route(self) -> None:
        self._active = False
        self._routed = None
        self._index = self._index_r = self._mult = None

    @property
    def multipliers(self) -> torch.Tensor | None:
        """The routed multiplier of every row ([B]; 0 for a row without a slider), or None without a route."""
        return None if self._mult is None else self._mult.view(-1)

    @property
    def slots(self) -> torch.Tensor | None:
        """The routed slot of every row ([B]; 0: no slider), or None without a route."""
        return self._index

    def _make_hook(self, key: str):
        stack = self._stacks[key]

        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            if not self._active or stack.up is None:
                return output
            x = args[0]
            if x.shape[0] != self._index.shape[0]:
                raise CnsbenchError(f"slider route has {self._index.shape[0]} rows, the UNet batch {x.shape[0]}")
            if stack.is_conv:
                apply_conv(stack.down, stack.up, module, x, output, self._index, self._index_r, self._mult)
            else:
                apply_linear(stack.down, stack.up, x, output, self._index, self._mult)
            return output

        return hook


def apply_linear(down, up, x, output, index, mult) -> None:
    """``output[b] += (x[b] @ down[index[b]]) * mult[b] @ up[index[b]]``, in place, every row at once."""
    b = x.shape[0]
    x3 = x if x.dim() == 3 else x.reshape(b, -1, x.shape[-1])
    h = torch.bmm(x3, down.index_select(0, index)).mul_(mult)
    out3 = output if output.dim() == 3 else output.view(b, -1, output.shape[-1])
    out3.baddbmm_(h, up.index_select(0, index))


def apply_conv(down, up, module, x, output, index, index_r, mult) -> None:
    """The conv form: each row's down kernel as one group of a grouped convolution over the
    batch folded into channels, then each row's 1x1 up as a ``bmm``, added in place."""
    b, c, height, width = x.shape
    h = F.conv2d(
        x.reshape(1, b * c, height, width), down.index_select(0, index_r), None,
        module.stride, module.padding, module.dilation, b,
    )
    h = h.reshape(b, -1, h.shape[-2] * h.shape[-1]).mul_(mult)
    output.view(b, output.shape[1], -1).baddbmm_(up.index_select(0, index), h)
