"""A driver that holds a build's up-front GPU request, or reads the requests Ray Data's
coordinator holds: for ``tests/test_autoscale.py``, on its fake autoscaling cluster.

    python request_holder.py hold ADDRESS OUTPUT N   # N one-GPU bundles as OUTPUT's build; "held"; wait
    python request_holder.py show ADDRESS GPUS       # wait until the coordinator's cnsbench requests hold
                                                     # GPUS GPUs (300 s at most); print them as JSON

``hold`` asks as the build's executor does (:func:`pipeline.executors.ray_private.budget_request`
under the output's requester id), with pool actors that never start, so the request is never
handed over: it lasts as long as the driver renews it.
"""

from __future__ import annotations

import json
import sys
import threading
import time


def main(argv: list[str]) -> None:
    import ray

    from pipeline.executors import ray_private

    mode, address = argv[0], argv[1]
    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    if mode == "hold":
        output, n = argv[2], int(argv[3])
        bundles = [{"CPU": 1.0, "GPU": 1.0} for _ in range(n)]
        with ray_private.budget_request(bundles, first_gpus=n + 1, requester=ray_private.requester_id(output)):
            print("held", flush=True)
            threading.Event().wait()
    coordinator = ray_private.autoscaling_coordinator()
    want, deadline, held = float(argv[2]), time.monotonic() + 400, {}  # within the tests' GROWTH_TIMEOUT
    while time.monotonic() < deadline:
        held = ray.get(coordinator.__ray_call__.remote(lambda self: {
            rid: sum(float(b.get("GPU", 0)) for b in req.requested_resources)
            for rid, req in self._ongoing_reqs.items() if rid.startswith("cnsbench-")}))
        if sum(held.values()) >= want:
            break
        time.sleep(1)
    print(json.dumps(held), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
