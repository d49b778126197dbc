"""Profiling: metric groups, Nsight Compute and torch.profiler sources, profiles, cache, Profiler.

Importing this package pulls in no GPU library, no ray, polars or openai (pyarrow only when a cache is
opened), so the profiled program (``_program.py``) runs on a bare GPU box.
"""

from autoprofiler.profiling.cache import CacheEnvironment, ProfileCache
from autoprofiler.profiling.groups import (
    CONFIGURATIONS,
    GROUPS,
    ROOT_GROUP,
    TORCH_ROOT_GROUP,
    MetricGroup,
    resolve_groups,
)
from autoprofiler.profiling.ncu import (
    CountersNotPermitted,
    NcuNotFound,
    NoKernelsProfiled,
    ProfilerError,
    ProgramFailed,
)
from autoprofiler.profiling.profile import Profile, render_profile
from autoprofiler.profiling.profiler import Profiler

__all__ = [
    "CONFIGURATIONS",
    "GROUPS",
    "ROOT_GROUP",
    "TORCH_ROOT_GROUP",
    "CacheEnvironment",
    "CountersNotPermitted",
    "MetricGroup",
    "NcuNotFound",
    "NoKernelsProfiled",
    "Profile",
    "ProfileCache",
    "Profiler",
    "ProfilerError",
    "ProgramFailed",
    "render_profile",
    "resolve_groups",
]
