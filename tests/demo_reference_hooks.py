"""Build the demo with the former per-slider hooks in place of the stacked slider bank, and
print the output's digest: the check that the code around the sliders computes what it did.

    python tests/demo_reference_hooks.py OUT            # the former hooks (tests/slider_reference.py)
    python tests/demo_reference_hooks.py OUT --bank     # the stacked bank, as the demo runs

The digest of the first equals that of ``cnsbench demo --runner local`` at a commit from
before the bank (BENCHMARKS.md, "The demo's digest across the restructure").  Pixels depend
on the threads a process runs, so a digest is compared with one made by the same runner
(here: in process) on the same kind of machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from slider_reference import ReferenceSliderHooks  # noqa: E402


class ReferenceBank(ReferenceSliderHooks):
    """The hooks with the bank's bookkeeping calls (capacity, reserve, membership) as no-ops."""

    def __init__(self, unet, capacity: int = 16) -> None:
        super().__init__(unet)
        self.capacity = capacity

    def __contains__(self, name: str) -> bool:
        return name in self.sliders

    def reserve(self, slots: int) -> None:
        pass

    def mark_static(self) -> None:
        pass

    def add(self, name, state, source: str = "<state dict>") -> None:
        super().add(name, state)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("output")
    p.add_argument("--bank", action="store_true", help="keep the stacked bank (the demo as it runs)")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import pipeline.models.sampler as sampler
    from pipeline.cli import main as cli
    from pipeline.io.digest import output_digest

    if not args.bank:
        sampler.SliderBank = ReferenceBank
    rc = cli(["demo", "--runner", "local", "--output", args.output])
    print(json.dumps({"rc": rc, "sliders": "bank" if args.bank else "reference hooks", **output_digest(args.output)}))
    return rc


if __name__ == "__main__":
    sys.exit(main())
