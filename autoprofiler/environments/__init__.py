"""Environments: where profiles and reward rows come from (live workers or a recording).

- ``environment``: ``Environment`` (cells in, rows out, each computed once), ``LiveEnvironment``,
  ``ReplayEnvironment``;
- ``profiles``: ``RecordedProfiler`` (profiles answered from a profile table);
- ``recording``: ``record`` (a whole suite: every group, every rule action), ``derive_configuration_rows``.
"""

from autoprofiler.environments.environment import (
    CellFailed,
    Environment,
    EnvStats,
    LiveEnvironment,
    MissingOutcome,
    ReplayEnvironment,
    configuration_groups,
    new_run_id,
)
from autoprofiler.environments.profiles import MissingProfile, RecordedProfiler
from autoprofiler.environments.recording import action_cells, derive_configuration_rows, record

__all__ = [
    "CellFailed",
    "EnvStats",
    "Environment",
    "LiveEnvironment",
    "MissingOutcome",
    "MissingProfile",
    "RecordedProfiler",
    "ReplayEnvironment",
    "action_cells",
    "configuration_groups",
    "derive_configuration_rows",
    "new_run_id",
    "record",
]
