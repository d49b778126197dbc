"""ProfileCache: Parquet round trip, per-group rows, keys include the environment, append-only parts."""

from __future__ import annotations

import time

from autoprofiler.profiling.cache import CacheEnvironment, ProfileCache, cache_key
from autoprofiler.profiling.profile import Profile

H200 = CacheEnvironment(device="NVIDIA H200", driver="580.159", tool="ncu 2025.3.1.0")
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
T = "gpu__time_duration.sum"


def two_group_profile() -> Profile:
    return Profile(
        task_hash="abc",
        source="ncu",
        groups=frozenset({"root", "memory"}),
        metrics={SM: 65.0, T: 4000.0, "derived__kernel_count": 2.0, "dram__bytes_read.sum": 4000.0},
        kernels=[
            {"name": "k0", "id": 0, T: 3000.0, SM: 80.0, "dram__bytes_read.sum": 1000.0},
            {"name": "k1", "id": 1, T: 1000.0, SM: 20.0, "dram__bytes_read.sum": 3000.0},
        ],  # fmt: skip
        passes=12,
        seconds=7.5,
        device="NVIDIA H200",
        units={SM: "%", T: "ns", "dram__bytes_read.sum": "byte"},
    )


def test_round_trip_per_group(tmp_path):
    """Each group becomes its own row; reading both back rebuilds the profile (cost zeroed on get)."""
    cache = ProfileCache(tmp_path)
    profile = two_group_profile()
    cache.put(profile, H200)
    assert len(cache) == 2 and len(list(tmp_path.glob("part-*.parquet"))) == 1
    reopened = ProfileCache(tmp_path)
    root = reopened.get_group("abc", "root", H200)
    assert root.metrics == {SM: 65.0, T: 4000.0, "derived__kernel_count": 2.0}
    assert root.kernels[0] == {"name": "k0", "id": 0, T: 3000.0, SM: 80.0}
    assert root.passes == 12 and root.seconds == 7.5  # the original cost is kept in the row
    both = reopened.get("abc", ["memory", "root"], H200)
    assert both.metrics == profile.metrics and both.kernels == profile.kernels and both.units == profile.units
    assert both.passes == 0 and both.seconds == 0.0 and both.groups == {"root", "memory"}
    assert reopened.get("abc", ["root", "stalls"], H200) is None


def test_environment_is_part_of_the_key(tmp_path):
    """Another GPU, driver or tool version misses; the key is stable and distinct per field."""
    cache = ProfileCache(tmp_path)
    cache.put(two_group_profile(), H200)
    for other in (
        CacheEnvironment("NVIDIA A100", "580.159", "ncu 2025.3.1.0"),
        CacheEnvironment("NVIDIA H200", "575.0", "ncu 2025.3.1.0"),
        CacheEnvironment("NVIDIA H200", "580.159", "ncu 2024.1.0"),
    ):
        assert cache.get_group("abc", "root", other) is None
    assert cache_key("abc", "root", H200) == cache_key("abc", "root", H200)
    assert cache_key("abc", "root", H200) != cache_key("abc", "memory", H200)


def test_append_only_later_part_wins_and_torn_parts_are_skipped(tmp_path):
    """A second put appends a new part; reopening sees both, the newer row wins; junk files are ignored."""
    cache = ProfileCache(tmp_path)
    cache.put(two_group_profile(), H200)
    newer = two_group_profile().restrict(["root"])
    newer.metrics[SM] = 66.0
    ProfileCache(tmp_path).put(newer, H200)
    (tmp_path / "part-99999999999999999999-torn.parquet").write_bytes(b"not parquet")
    reopened = ProfileCache(tmp_path)
    assert len(list(tmp_path.glob("part-*.parquet"))) == 3
    assert reopened.get_group("abc", "root", H200).metrics[SM] == 66.0
    assert reopened.get_group("abc", "memory", H200).metrics["dram__bytes_read.sum"] == 4000.0


def test_shared_metric_keeps_its_first_measured_value(tmp_path):
    """A metric in two groups measured by two runs: merging cached groups keeps the older run's value."""
    cache = ProfileCache(tmp_path)
    cache.put(Profile("abc", "ncu", frozenset({"root"}), {SM: 1.0, T: 10.0}), H200)
    time.sleep(0.01)
    cache.put(Profile("abc", "ncu", frozenset({"speed_of_light"}), {SM: 2.0, T: 20.0}), H200)
    merged = ProfileCache(tmp_path).get("abc", ["speed_of_light", "root"], H200)
    assert merged.metrics[SM] == 1.0 and merged.metrics[T] == 10.0
