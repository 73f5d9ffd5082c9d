"""Ray, up: join the cluster a job was submitted to, or start a local Ray on loopback. Used by the dataset build's
engine and by the training launcher (`training.launch`), the two places that run on Ray.

A local Ray (no RAY_ADDRESS) listens on 127.0.0.1 only, whatever the environment: Ray decides at import time
whether to advertise the machine's external address, so `init_ray` sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before
importing it (and corrects Ray's constant when something imported Ray earlier) and passes the node address.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
START_ATTEMPTS = 3


def init_ray(num_cpus: int | None = None, dashboard: bool = False) -> None:
    """Join the cluster when there is one (`ray job submit` sets RAY_ADDRESS), else start a local Ray on loopback.

    `num_cpus` caps a local Ray (ignored when joining a cluster, whose size the cluster decides). `dashboard` starts
    the local dashboard (on 127.0.0.1): Ray Train needs it, because its placement-group cleaner asks the state API,
    served by the dashboard, whether the train controller is alive (without it, it warns every second and cannot
    clean up after a crashed controller). The data build does without it (less memory and CPU on small machines).
    """
    if not os.environ.get("RAY_ADDRESS"):
        # Read by Ray when it is imported and by every process it starts: with it, a node's listeners bind to
        # loopback and it advertises 127.0.0.1 (the node address alone does not stop the external one).
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        log.info("using the Ray already initialised in this process (%d CPUs)",
                 int(ray.cluster_resources().get("CPU", 0)))
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        log.info("attached to the Ray cluster at %s (%d CPUs)", os.environ["RAY_ADDRESS"],
                 int(ray.cluster_resources().get("CPU", 0)))
        return
    # Something imported Ray before the variable was set: correct what Ray read from it (pinned Ray: private name).
    ray_constants.ENABLE_RAY_CLUSTER = False
    # address="local": without it, ray.init() joins any cluster already running on this machine (someone's
    # `ray start`, another job's session) and then refuses num_cpus; we promised a fresh local Ray.
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard, _node_ip_address=LOOPBACK)
            return
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this; anything else re-raises
            if "timed out during startup" not in str(e) or attempt == START_ATTEMPTS:
                raise
            # Ray gives a new node a hard-coded 30 s to register; an overloaded machine can miss that.
            log.warning("local Ray start timed out (attempt %d of %d, machine overloaded?); retrying",
                        attempt, START_ATTEMPTS)
            ray.shutdown()
