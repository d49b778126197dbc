"""Serving: the learned profiling tree behind an HTTP ``/route`` and ``/optimize`` service (Ray Serve).

``serve run serve_config.yaml`` (app builder ``autoprofiler.serving.app:build``) or
``python workflows/serve.py``; the endpoints are listed in ``autoprofiler.serving.api``. Importing this
package does not import Ray; ``autoprofiler.serving.app`` does.
"""

from autoprofiler.serving.jobs import JobBoard, JobsFull, WorkerLost
from autoprofiler.serving.routing import RouteStep, ServedTree, load_served_tree, next_step
from autoprofiler.serving.settings import ServeSettings, SettingsError, check_binding, settings_from_args

__all__ = [
    "JobBoard",
    "JobsFull",
    "RouteStep",
    "ServeSettings",
    "ServedTree",
    "SettingsError",
    "WorkerLost",
    "check_binding",
    "load_served_tree",
    "next_step",
    "settings_from_args",
]
