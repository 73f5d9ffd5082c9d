"""The local Ray of the tests that run Ray in the pytest process (``ray_local`` in conftest.py)."""
from __future__ import annotations

from _bare import needs

_OURS: dict[str, str] = {}  # the GCS address of the local Ray this pytest process started


def ensure_local_ray(temp_dir: str):
    """A local Ray (2 logical CPUs, loopback: conftest.py's environment) in this process: the one started here
    before, reused while it runs, else started (again), after shutting down any other Ray this process is attached to.
    Returns the ``ray`` module."""
    ray = needs("ray")
    if not (ray.is_initialized() and _OURS.get("gcs") == ray.get_runtime_context().gcs_address):
        if ray.is_initialized():
            ray.shutdown()
        ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False,
                 configure_logging=False)
        _OURS["gcs"] = ray.get_runtime_context().gcs_address
    ray.data.DataContext.get_current().enable_progress_bars = False
    return ray


def shutdown_local_ray() -> None:
    """At the session's end: shut down the local Ray started here, if it still runs."""
    ray = needs("ray")
    if _OURS and ray.is_initialized() and _OURS.get("gcs") == ray.get_runtime_context().gcs_address:
        ray.shutdown()
