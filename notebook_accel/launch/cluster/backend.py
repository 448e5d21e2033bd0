"""The backends of launches whose ranks run on a cluster (launch/backend.py's interface).

    config.cluster = "ray" or "ray://HOST:PORT"  -> ray/driver.py's RayBackend (imports Ray
                                                   only now)

Another cluster engine (SLURM through submitit, say) is one more module implementing
``Backend`` and one more case in ``for_cluster``.
"""

from __future__ import annotations

from ...config import LaunchConfig
from ...errors import ConfigError
from ..backend import Backend

__all__ = ["for_cluster"]


def for_cluster(config: LaunchConfig) -> Backend:
    """The backend that ``config.cluster`` names (imports its engine only now)."""
    cluster = config.cluster or ""
    if cluster == "ray" or cluster.startswith("ray://"):
        from .ray.driver import RayBackend

        return RayBackend(config)
    raise ConfigError("cluster", cluster, "None, 'ray' or 'ray://HOST:PORT'")
