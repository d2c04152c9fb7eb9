"""The stacked slider bank: equal to the per-slider hooks it replaced, at a constant number of ops.

The oracle is the former hook implementation (``tests/slider_reference.py``): per layer,
a loop over the batch's sliders with ``index_add``.  The bank must give the same UNet
output within 1e-5 (float32) over sliders of mixed ranks (1, 4, 8), attention-only and
conv sliders, rows without a slider, repeated and zero multipliers; rows without a slider
must be bit-identical to the bare UNet; and one forward must dispatch the same aten ops
whatever the number of distinct sliders in the batch.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.models.lora import SliderBank, random_slider
from slider_reference import ReferenceSliderHooks

# (rank, targets, alpha): mixed ranks, attention-only and conv sliders, alpha/rank not a power of 2.
SLIDERS = {
    "r1_attn": (1, "attn", 1.0),
    "r4_conv": (4, "attn_conv", 1.0),
    "r8_conv": (8, "attn_conv", 3.0),
    "r4_attn": (4, "attn", 2.0),
    "r8_attn": (8, "attn", 1.0),
    "r1_conv": (1, "attn_conv", 0.5),
}


@pytest.fixture(scope="module")
def unet(tiny_sd):
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel.from_pretrained(tiny_sd, subfolder="unet").eval()


@pytest.fixture(scope="module")
def states(unet):
    return {
        name: random_slider(unet, rank=rank, alpha=alpha, targets=targets, seed=i, std=0.1)
        for i, (name, (rank, targets, alpha)) in enumerate(SLIDERS.items())
    }


def inputs(batch: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 4, 8, 8, generator=gen), torch.randn(batch, 77, 32, generator=gen)


def forward(unet, x, emb, t=500):
    with torch.inference_mode():
        return unet(x, t, encoder_hidden_states=emb).sample.clone()


def random_routes(n: int, batch: int, seed: int = 0) -> list[tuple[list, list]]:
    rng = random.Random(seed)
    names = [None, *SLIDERS]
    routes = []
    for _ in range(n):
        rows = [rng.choice(names) for _ in range(batch)]
        mults = [rng.choice([0.0, 0.5, 1.0, 2.5, -1.5]) for _ in range(batch)]
        routes.append((rows, mults))
    # Hand-made cases: one slider on every row at one multiplier (the reference's uniform
    # path); a slider repeated at several multipliers, zeros and rows without a slider.
    routes.append((["r8_conv"] * batch, [2.0] * batch))
    routes.append(
        (["r4_conv", "r4_conv", None, "r1_attn", "r4_conv", "r8_attn", None, "r1_attn"][:batch],
         [0.5, 2.5, 1.0, 1.0, 0.0, -1.0, 0.0, 1.5][:batch])
    )
    return routes


def outputs(bank_or_ref, unet, states, routes, x, emb) -> list[torch.Tensor]:
    for name, state in states.items():
        bank_or_ref.add(name, state)
    out = []
    try:
        for rows, mults in routes:
            bank_or_ref.route(rows, mults)
            out.append(forward(unet, x, emb))
    finally:
        bank_or_ref.detach()
    return out


def test_stacked_bank_equals_the_reference_hooks(unet, states):
    batch = 8
    x, emb = inputs(batch)
    routes = random_routes(6, batch)
    bare = forward(unet, x, emb)
    ref = outputs(ReferenceSliderHooks(unet), unet, states, routes, x, emb)
    ours = outputs(SliderBank(unet), unet, states, routes, x, emb)
    worst = max(float((a - b).abs().max()) for a, b in zip(ours, ref))
    assert worst <= 1e-5
    for (rows, mults), out in zip(routes, ours):
        for i, (s, m) in enumerate(zip(rows, mults)):
            if s is None or m == 0:
                assert torch.equal(out[i], bare[i]), (rows, mults, i)  # adds exact zeros
            else:
                assert float((out[i] - bare[i]).abs().max()) > 1e-3  # the slider acts
    assert torch.equal(forward(unet, x, emb), bare)  # detached: the UNet is as before


def test_growth_and_replacement_keep_every_loaded_slider_exact(unet, states):
    """A bank that starts with 2 slots and rank 1 grows (slots, then rank 4 and 8) and
    replaces its least recently used slider when full; the loaded ones stay exact."""
    batch = 6
    x, emb = inputs(batch, seed=1)
    route = (["r1_attn", "r4_conv", None, "r8_conv", "r4_conv", "r1_attn"], [1.0, 2.0, 0.0, 0.5, -1.0, 2.5])
    ref = outputs(ReferenceSliderHooks(unet), unet, states, [route], x, emb)[0]

    bank = SliderBank(unet, capacity=2)
    try:
        bank.add("r1_attn", states["r1_attn"])
        bank.add("r4_attn", states["r4_attn"])
        assert bank.rank == 4 and bank.capacity == 2
        bank.route(["r1_attn"] * batch, [1.0] * batch)  # r1_attn is routed: it stays
        bank.add("r4_conv", states["r4_conv"])  # full: the least recent other slider goes
        assert bank.names() == ["r1_attn", "r4_conv"] and bank.capacity == 2
        bank.reserve(3)  # grows (at least doubles); what is loaded is kept
        bank.add("r8_conv", states["r8_conv"])  # padded rank 4 -> 8
        assert bank.capacity == 4 and bank.rank == 8
        bank.route(*route)
        got = forward(unet, x, emb)
        with pytest.raises(KeyError, match="r4_attn"):
            bank.route(["r4_attn"], [1.0])
    finally:
        bank.detach()
    assert float((got - ref).abs().max()) <= 1e-5


def test_a_bad_slider_leaves_the_bank_as_it_was(unet, states):
    bank = SliderBank(unet)
    try:
        bank.add("good", states["r4_conv"])
        key = next(k for k in states["r4_conv"] if k.endswith("conv1.lora_down.weight"))
        broken = {**states["r1_attn"], key: torch.zeros(4, 3, 3, 3)}
        with pytest.raises(ValueError, match="conv1"):
            bank.add("bad", broken)
        with pytest.raises(ValueError, match="match no UNet module"):
            bank.add("bad", {"lora_unet_nowhere.lora_down.weight": torch.zeros(1, 1)})
        assert bank.names() == ["good"]
        bank.route(["good", None], [1.0, 1.0])
        with pytest.raises(ValueError, match="2 rows"):
            forward(unet, *inputs(3))
        with pytest.raises(ValueError, match="differ in length"):
            bank.route(["good"], [1.0, 2.0])
        bank.route([None, "good"], [1.0, 0.0])  # nothing on: no route
        assert bank.multipliers is None
    finally:
        bank.detach()


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(unet, x, emb) -> int:
    with torch.inference_mode(), OpCounter() as counter:
        unet(x, 500, encoder_hidden_states=emb)
    return counter.count


def test_ops_per_forward_do_not_depend_on_the_number_of_distinct_sliders(unet, states):
    batch = 16
    x, emb = inputs(batch)
    bare = count_ops(unet, x, emb)
    names = list(SLIDERS)
    bank = SliderBank(unet)
    try:
        for name, state in states.items():
            bank.add(name, state)
        counts = {}
        for distinct in (1, 2, 4, 6):
            bank.route([names[i % distinct] for i in range(batch)], [1.0 + i for i in range(batch)])
            counts[distinct] = count_ops(unet, x, emb)
        bank.clear_route()
        assert count_ops(unet, x, emb) == bare
    finally:
        bank.detach()
    assert len(set(counts.values())) == 1, counts
    assert bare < counts[1]
