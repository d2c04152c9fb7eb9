"""Arguments of the Serve application and the Serve options of its model deployments.

:class:`ServeOptions` is what ``build_app`` takes (the ``args:`` of a Serve config file,
``serve run ... key=value``, or ``cnsbench serve``'s flags); :func:`deployment_options`
turns a stage's ``resources`` entry into a deployment's replicas and actor resources.
The constants here are shared by the other modules of :mod:`pipeline.serve`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline.config import StageResources

APP_NAME = "cnsbench"
TOKEN_ENV = "CNSBENCH_API_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
MAX_SEED = 2**31 - 1
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
#: Paths reachable without the token: the page itself carries no data.
PUBLIC_PATHS = frozenset({"/", "/healthz", "/review"})
IMAGE_TYPES = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "webp": "image/webp"}
REPORT_TYPES = {
    ".png": "image/png",
    ".csv": "text/csv; charset=utf-8",
    ".json": "application/json",
    ".html": "text/html; charset=utf-8",
}


class ServeOptions(BaseModel):
    """Arguments of :func:`~pipeline.serve.deployments.build_app` (the ``args:`` of a Serve config).

    At least one of ``config`` (live preview) and ``output`` (browse a build) is required.
    """

    model_config = ConfigDict(extra="forbid")

    config: str | None = Field(None, description="build config YAML: enables the live preview")
    output: str | None = Field(None, description="build output directory or URI: enables the benchmark browser")
    token: str | None = Field(None, description=f"bearer token for the API (default: ${TOKEN_ENV})")
    max_body_bytes: int = Field(16 * 1024, ge=256, le=10 * 1024 * 1024, description="larger request bodies get 413")
    max_preview_scales: int = Field(12, ge=1, le=64, description="scales per preview request, scale 0 included")
    scale_bound_factor: float = Field(
        2.0, gt=0, le=100, description="preview scales must lie in the config's scale range times this"
    )
    refresh_s: float = Field(10.0, ge=0, description="how often to look for new committed shards (0: never)")
    preview_cache_size: int = Field(16, ge=0, le=1024, description="preview results kept in the ingress")
    max_queued_previews: int = Field(16, ge=1, description="previews waiting per generator before 503")
    ingress_num_cpus: float = Field(0.25, gt=0, description="CPUs of the ingress replica")
    allowed_hosts: list[str] | None = Field(None, description="accepted Host headers (None: any)")

    @field_validator("token", mode="before")
    @classmethod
    def _blank_token(cls, value: Any) -> Any:
        # An empty --token or an empty env var must not silently mean "token ''".
        return None if isinstance(value, str) and not value.strip() else value


def deployment_options(res: StageResources, *, max_ongoing_requests: int, max_queued_requests: int) -> dict[str, Any]:
    """Serve options of a model deployment from a stage's ``resources`` entry.

    Replicas autoscale between ``pool_size`` and ``max_pool_size`` (``pool_size`` when
    unset) on ongoing requests, one model call per replica at a time.
    """
    return {
        "ray_actor_options": {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus},
        "autoscaling_config": {
            "min_replicas": res.pool_size,
            "initial_replicas": res.pool_size,
            "max_replicas": res.max_pool_size or res.pool_size,
            "target_ongoing_requests": 1,
        },
        "max_ongoing_requests": max_ongoing_requests,
        "max_queued_requests": max_queued_requests,
    }
