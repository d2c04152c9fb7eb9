"""Ray Data executor: rows stream through one actor pool per stage.

    rows --map_batches(stage 1)--> ... --map_batches(writer)--> one row per committed shard

Each stage is a callable class in an ``ActorPoolStrategy`` pool whose size, GPUs, CPUs
and batch size come from its :class:`~pipeline.executors.chain.StageSpec` (by default
``resources.<stage>`` of the config); weights load once per actor.  The driver only
iterates the small per-shard rows, so its memory does not grow with the plan.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from typing import Any, Iterable, Iterator

from pipeline.config import StageResources
from pipeline.errors import CnsbenchError
from pipeline.executors import cluster
from pipeline.executors.base import Executor, RunOptions, stage_threads
from pipeline.executors.chain import Chain
from pipeline.executors.pools import Sized, budget_bundles, first_gpus, size_pools, upfront_request
from pipeline.executors.ray_private import budget_request, exact_blocks, raise_stage_errors, requester_id, stage_error
from pipeline.io.lease import LeaseLost
from pipeline.runtime.faults import fault_env

log = logging.getLogger(__name__)


def init_ray(address: str | None, chain: Chain | None = None, notice=None) -> None:
    """Connect to the cluster at ``address`` (``auto``: the running ``ray start`` cluster) or,
    without one, start a local Ray sized for ``chain``'s pools (:mod:`pipeline.executors.cluster`)."""
    import ray

    if ray.is_initialized():
        return
    from pipeline.runtime.progress import quiet_ray_data

    quiet_ray_data()  # Ray Data's own bars and logs only with `cnsbench -v`
    target = cluster.given_address(address)
    if target:
        # A Ray job's driver (`cnsbench submit`, KubeRay RayJob) gets the cluster in
        # $RAY_ADDRESS, and ray.init() refuses num_cpus/num_gpus when it connects to one.
        # Fault-injection rules (tests only: pipeline/runtime/faults.py) travel to the job's workers.
        if target == cluster.AUTO:
            cluster.check_auto()
        faults = fault_env()
        ray.init(address=target, log_to_driver=True, **({"runtime_env": {"env_vars": faults}} if faults else {}))
        return
    note = cluster.running_cluster_note()
    if note:
        (notice or log.info)(note)
    from pipeline.runtime.progress import quiet_local_ray, verbose

    quiet_local_ray()  # Ray's notice that the new cluster uses token authentication only with -v
    # Enough logical CPUs for one actor of every pool plus the read tasks; oversubscribing
    # logical CPUs is harmless, a pool waiting forever for a CPU is not.
    wanted = chain.local_cpus() if isinstance(chain, Chain) else 0.0
    cpus = max(os.cpu_count() or 1, math.ceil(wanted) + 1)
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count()
    except Exception:
        pass
    # Only the GPUs there are: a logical GPU on a machine without one let the pools' GPU
    # fractions (generate 1 + filter 0.25 + 0.5 per classifier group) exceed it, and a
    # downstream pool holding it waited forever for an upstream one that could not start.
    # Without a GPU every pool runs on the CPU (cpu_only_local_cluster).
    # address="local": a new Ray whatever Ray's bootstrap file names (a `ray start` cluster,
    # running or gone), never a connection to it.
    ray.init(
        address=cluster.LOCAL,
        num_cpus=cpus,
        num_gpus=gpus,
        include_dashboard=False,
        logging_level=logging.INFO if verbose() else logging.WARNING,  # "Started a local Ray instance" with -v
        log_to_driver=True,
        runtime_env={"env_vars": {"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0")}},
    )


def cpu_only_local_cluster(address: str | None) -> bool:
    """True when this driver runs a local Ray (no address) that has no GPU at all.

    A GPU request could never be met there (a cluster the user started with
    ``ray.init(num_cpus=...)``, say): pools then run on the CPU instead of waiting forever.
    On a real cluster (an address) requests stand: its placement is checked
    (:mod:`pipeline.executors.placement`).
    """
    import ray

    if cluster.given_address(address):
        return False
    return float(ray.cluster_resources().get("GPU", 0)) == 0


def _pool(sized: Sized):
    import ray

    return ray.data.ActorPoolStrategy(min_size=sized.min_size, max_size=sized.max_size, initial_size=sized.initial_size)


def _remote_args(stage: StageResources, bookkept: bool) -> dict:
    # A crashed actor is restarted and its batch retried.  Stages that keep attempt markers
    # (pipeline.runtime.faults; every stage of a build, the writer included) give up on a batch by
    # themselves after max_retries + 1 attempts, so Ray may retry them without limit: that
    # also rides out a node that is lost for a while (its actors are "unavailable" until the
    # node is declared dead and they restart elsewhere, and a bounded budget is spent on
    # retries that fail at once).  Stages without markers get a bounded budget.
    retries = -1 if bookkept else stage.max_retries + 1
    args = {"max_restarts": -1, "max_task_retries": retries}
    # Fault-injection rules (tests only: pipeline/runtime/faults.py) set in the driver reach the
    # actors on a Ray that was already running when the build started.
    faults = fault_env()
    if faults:
        args["runtime_env"] = {"env_vars": faults}
    return args


# What a stage raises for the user's input or storage (a full disk, a weight file refused, the
# output's lease taken over) reaches the command as it was raised: one line, as on the local
# runner.  Anything else (a bug) keeps Ray's error, with the actor's traceback.
USER_ERRORS = (OSError, ValueError, LeaseLost)


@contextlib.contextmanager
def user_errors_unwrapped() -> Iterator[None]:
    try:
        yield
    except Exception as err:
        original = stage_error(err)
        if isinstance(original, USER_ERRORS):
            raise original from None
        raise


class RayDataExecutor(Executor):
    name = "ray_data"

    @classmethod
    def check_held(cls, spec: Any) -> None:
        check_picklable(spec)  # it travels to the actors pickled, by value from __main__

    def _local_gpu_scale(self, chain: Chain) -> float:
        """The factor that fits every pool's GPU request into a local cluster's GPUs at once.

        Every pool of the chain must be able to hold its actors together: on a one-GPU node
        generate (1) + filter (0.25) + 0.5 per classifier group asked for more than the GPU,
        and pools that got it first waited forever for one upstream that could not start.
        On a local cluster the requests are scaled down to fit (the actors then share the
        GPUs; each pool's memory is :mod:`pipeline.perf.memory`'s projection).  A cluster given
        by address keeps them: GPU nodes may still join it.
        """
        import ray

        if cluster.given_address(self.address):
            return 1.0
        gpus = float(ray.cluster_resources().get("GPU", 0))
        wanted = sum(p.resources.num_gpus * p.resources.pool_size for p in chain.pools)
        if gpus <= 0 or wanted <= gpus:
            return 1.0
        scale = gpus / wanted
        message = (f"the actor pools ask for {wanted:g} GPUs and this local Ray cluster has {gpus:g}: every "
                   f"pool's num_gpus is scaled by {scale:.3f} so that all of them can start (they share the GPUs)")
        log.info(message)
        self.notice(message)
        return scale

    def _memory_requests(self, chain: Chain, cpu_only: bool) -> list[int | None]:
        """The host memory each pool's actors ask Ray for (``memory``): their projection
        (:attr:`pipeline.executors.chain.Pool.memory`), so that Ray places actors by memory on a cluster.

        A local Ray without a GPU asks for none (one machine: nothing to place).  On a local
        cluster whose memory the pools' requests exceed, every request is scaled to fit, as the
        GPU requests are (:meth:`_local_gpu_scale`); a cluster given by address keeps them."""
        import ray

        if cpu_only:
            return [None] * len(chain)
        pools = chain.pools
        wanted: list[int | None] = []
        for pool in pools:
            try:
                m = pool.memory()
                wanted.append(int(m) if m else None)
            except Exception as err:  # noqa: BLE001 - a projection is advice: the pool asks for none
                log.debug("no memory projection for %s: %s", pool.name, err)
                wanted.append(None)
        if cluster.given_address(self.address):
            return wanted
        total = sum((m or 0) * p.resources.pool_size for m, p in zip(wanted, pools))
        have = float(ray.cluster_resources().get("memory", 0))
        if have <= 0 or total <= have:
            return wanted
        scale = have / total
        self.notice(f"the actor pools' projected memory ({total / 2**30:.1f} GiB) exceeds this local Ray cluster's "
                    f"{have / 2**30:.1f} GiB: every pool's memory request is scaled by {scale:.3f}")
        return [int(m * scale) if m else None for m in wanted]

    def _sized(self, chain: Chain, cpu_only: bool) -> list[Sized]:
        """Each pool's resources after the local adjustments (a CPU-only local Ray runs GPU
        stages on the CPU; a local Ray's GPUs and memory are shared out to fit)."""
        gpu_scale = 1.0 if cpu_only else self._local_gpu_scale(chain)
        memory = self._memory_requests(chain, cpu_only)
        out = []
        for pool, mem in zip(chain.pools, memory):
            r = pool.resources
            if gpu_scale < 1.0 and r.num_gpus > 0:
                # Ray counts GPU fractions in 1e-4 steps: rounded down, the scaled sum still fits.
                r = r.model_copy(update={"num_gpus": max(1e-4, math.floor(r.num_gpus * gpu_scale * 1e4) / 1e4)})
            if cpu_only and r.num_gpus > 0:
                message = (f"no GPU in the local Ray cluster: the {pool.name} actors run on the CPU "
                           f"(resources num_gpus {r.num_gpus} -> 0)")
                log.info(message)
                self.notice(message)
                r = r.model_copy(update={"num_gpus": 0.0})
            out.append(Sized(pool, r, mem))
        return out

    def dataset(self, rows: list[dict], output: str, sized: list[Sized], options: RunOptions):
        """The Ray Data dataset of ``rows`` through the ``sized`` pools (not yet executed)."""
        import ray

        cfg_dict = held_by_reference(self.cfg)
        from pipeline.runtime.progress import quiet_ray_data

        quiet_ray_data()
        # Ray Data ends a dataset that moves no block for 30 min; one batch of a stage can take
        # longer than that (a generation unit of SD2 at 768 px on a CPU did), and a worker that
        # dies is retried by the actor restarts and attempt markers, so there is no such limit.
        ray.data.DataContext.get_current().execution_no_progress_timeout_s = -1
        raise_stage_errors()  # a user's error (a full disk) reaches the command as on the local runner
        ds = ray.data.from_items(rows, override_num_blocks=max(1, min(options.num_blocks or len(rows), len(rows))))
        for s in sized:
            r, spec, mem = s.resources, s.pool.spec, s.memory
            if spec.stage.exact_batches:
                # Ray Data hands an actor a bundle of blocks of at least batch_size rows and
                # cuts it into batch_size + a remainder: the stages' 8- and 6-row blocks made
                # about two shards per planned one (64 + 6).  Blocks of exactly batch_size
                # rows make one batch each.
                ds = exact_blocks(ds, s.pool.batch_size, tasks=r.pool_size)
            kwargs = {"config": cfg_dict, "output": output, "threads": stage_threads(r), **spec.kwargs}
            with warnings.catch_warnings():
                # Ray 2.60 has no named parameter for bounded actor restarts/retries yet; the
                # remote-args route it deprecates is still the only way to bound them.
                warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
                ds = ds.map_batches(
                    spec.stage,
                    fn_constructor_kwargs=kwargs,
                    batch_size=s.pool.batch_size,
                    batch_format="pyarrow",
                    compute=_pool(s),
                    num_gpus=r.num_gpus,
                    num_cpus=r.num_cpus,
                    **({"memory": mem} if mem else {}),
                    **_remote_args(r, bookkept=spec.stage.keeps_attempts),
                )
        return ds

    def execute(self, rows: Iterable[dict], output: str, chain: Chain, options: RunOptions) -> Iterator[dict]:
        init_ray(self.address, chain, self.notice)
        rows = list(rows)
        if not rows:
            return
        cpu_only = cpu_only_local_cluster(self.address)
        view = cluster.read_cluster(local=not cluster.given_address(self.address))
        from pipeline.executors.pools import check_local_actors

        check_local_actors(chain, view, cpu_only)  # as on a cluster, before the local Ray's sharing
        sized = size_pools(chain, self._sized(chain, cpu_only), view, self.notice)
        ds = self.dataset(rows, output, sized, options)
        from pipeline.runtime.progress import native_stderr_filtered

        # On an autoscaling cluster the whole budget is asked for now, so its GPU nodes start
        # together rather than one per autoscaler tick; the request is this output's own and ends
        # with the run, or expires once its driver is gone.
        with budget_request(budget_bundles(sized) if view.autoscaling and upfront_request() else [],
                            first_gpus=first_gpus(sized), requester=requester_id(output)):
            with native_stderr_filtered(), user_errors_unwrapped():  # NATIVE_NOISE: Ray's line per pool
                for row in ds.iter_rows():
                    row = dict(row)
                    if options.on_shard:
                        options.on_shard(row)
                    yield row


def check_picklable(spec: Any) -> None:
    """Refuse (:class:`pipeline.errors.CnsbenchError`, naming the classifier) an object held in
    memory that cannot be pickled for Ray's actors (a lock, an open handle)."""
    from ray import cloudpickle

    try:
        cloudpickle.dumps(spec.held)
    except Exception as err:  # noqa: BLE001 - pickling runs the object's own code
        raise CnsbenchError(f"classifiers[{spec.name}]: its model cannot be sent to the Ray workers (runner ray "
                            f"pickles it): {type(err).__name__}: {err}"[:600]) from None


def held_by_reference(cfg: Any) -> Any:
    """The config the actors are built with: its JSON form, or, where classifiers hold an object
    in memory (kind ``module``), the config with each such object put in Ray's object store once
    (``ray.put``; a class defined in ``__main__`` or a notebook travels by value) and referenced."""
    import ray

    if all(c.held is None for c in cfg.classifiers):
        return cfg.model_dump(mode="json")
    specs = []
    for c in cfg.classifiers:
        if c.held is not None and not isinstance(c.held, ray.ObjectRef):
            check_picklable(c)
            c = c.holding(ray.put(c.held))
        specs.append(c)
    return cfg.model_copy(update={"classifiers": specs})
