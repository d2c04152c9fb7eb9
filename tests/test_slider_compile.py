"""``generator.compile``: the UNet compiled with the slider hooks inside its graph.

Compiled generation must give the eager images, and a change of sliders, multipliers or
rows must not recompile: the routes are tensors and the window's chunks are padded to the
branch batch.  Compilations are counted by torch's own ``CompileCounterWithBackend``.

The counting runs on the ``aot_eager`` backend: it traces the UNet with dynamo and
functionalizes it through AOTAutograd exactly as inductor's front end does (so graph
breaks, guards and recompilations are the same), but skips inductor's C++ code generation,
which on the 2-core CPU VM took 85 s for the tiny UNet's first graph and would say nothing
more about recompilation (that run: inductor's output within 1.8e-6 of eager over six
routes, one graph, no recompilation when a slider was added).  The ``generator.compile: true`` path (inductor) is checked to compile the
UNet in place without running it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.models.lora import target_modules
from test_generation import make_sampler

SCALES = [0.0, 0.5, 1.0, 2.5]


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def arr(img) -> np.ndarray:
    return np.asarray(img).astype(np.int16)


def test_compiled_sampler_equals_eager_and_compiles_once(tiny_world, fresh_dynamo):
    from torch._dynamo.testing import CompileCounterWithBackend

    kw = dict(steps=8, branch_batch_size=4)
    eager = make_sampler(tiny_world, **kw)
    compiled = make_sampler(tiny_world, **kw)
    counter = CompileCounterWithBackend("aot_eager")
    compiled.compile_unet(backend=counter)

    # The first unit compiles two graphs: the steps before the window (a CFG batch of 2) and
    # the window's chunks (padded to 4 branches, a batch of 8), the last chunk being short.
    first = (1, 3, ["shift_a", "shift_b"], SCALES)
    got = compiled.generate_group(*first)
    assert counter.frame_count == 2
    want = eager.generate_group(*first)
    for key in want.images:
        assert np.abs(arr(got.images[key]) - arr(want.images[key])).max() <= 1, key

    # Five more routes: other classes, shifts, scales and rows per chunk.
    routes = [
        (22, 5, ["shift_b"], [0.0, 2.5]),
        (1, 4, ["shift_b", "shift_a"], [0.0, 1.0, 0.5]),
        (22, 3, ["shift_a", "shift_b"], [0.0, -1.0, 2.0, 1.5, 0.5]),
        (1, 7, ["shift_a"], [0.0, 1.0, 2.0, 2.5]),
        (22, 9, ["shift_a", "shift_b"], [0.0, 0.5]),
    ]
    for route in routes:
        got = compiled.generate_group(*route)
        want = eager.generate_group(*route)
        for key in want.images:
            assert np.abs(arr(got.images[key]) - arr(want.images[key])).max() <= 1, (route, key)
    assert counter.frame_count <= 2 + 1  # at most one compilation after the first unit; in fact none
    assert counter.frame_count == 2
    assert not torch._dynamo.utils.counters["graph_break"]  # the hooks are inside the graph


def test_generator_compile_compiles_the_unet_in_place(tiny_world, fresh_dynamo):
    sampler = make_sampler(tiny_world, compile=True)
    unet = sampler.pipe.unet
    assert sampler.compiled and unet._compiled_call_impl is not None
    # Same module, same paths: the bank's hooks and keys are those of the eager UNet.
    assert type(unet).__name__ == "UNet2DConditionModel"
    paths = list(target_modules(unet, "attn"))
    assert "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q" in paths
