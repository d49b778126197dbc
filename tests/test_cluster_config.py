"""ray_cluster.yaml: Ray's own cluster-launcher checks (offline: defaults filled in, then the JSON schema),
and what autoprofiler needs of it: a CPU head, a GPU worker type, the package installed on every node,
the versions CI tests with, and the note on ncu's counter permissions."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "ray_cluster.yaml"

ray = pytest.importorskip("ray")
pytest.importorskip("jsonschema")  # validate_config's schema check


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(CONFIG.read_text())


@pytest.fixture(scope="module")
def prepared(raw) -> dict:
    """The config as ``ray up`` sees it: the provider's defaults filled in, then validated."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(copy.deepcopy(raw))
    validate_config(config)
    return config


def test_ray_accepts_the_config_and_rejects_a_typo(raw, prepared):
    """prepare_config + validate_config (no network) pass; a misspelt node-type key fails the schema."""
    from jsonschema import ValidationError
    from ray.autoscaler._private.util import prepare_config, validate_config

    assert prepared["provider"]["type"] in ("aws", "gcp")
    bad = copy.deepcopy(raw)
    bad["available_node_types"]["gpu.worker"]["resourcez"] = {"GPU": 1}
    with pytest.raises(ValidationError):
        validate_config(prepare_config(bad))


def test_a_cpu_head_and_a_gpu_worker_type(prepared):
    """The head holds no GPU (no GpuWorker lands there); the worker type declares GPUs and may scale."""
    types = prepared["available_node_types"]
    head = types[prepared["head_node_type"]]
    assert not head["resources"].get("GPU")
    gpu_types = {name: t for name, t in types.items() if t["resources"].get("GPU", 0) >= 1}
    assert gpu_types and prepared["head_node_type"] not in gpu_types
    assert all(t["max_workers"] >= 1 for t in gpu_types.values())


def test_every_node_installs_this_package_at_the_tested_versions(raw, prepared):
    """The checkout is mounted and pip-installed on every node; torch and Ray are pinned to what CI uses."""
    (remote,) = [r for r, local in raw["file_mounts"].items() if local in (".", "./")]
    commands = prepared["setup_commands"]
    assert any(re.search(rf"pip install .*-e {re.escape(remote)}\b", c) for c in commands), commands
    for node_commands in (prepared["head_setup_commands"], prepared["worker_setup_commands"]):
        assert commands == node_commands[: len(commands)]  # ray up runs the common ones on every node
    joined = " ".join(commands)
    assert f"ray[default,data,serve]=={ray.__version__}" in joined
    ci_torch = re.search(r"torch==([\w.]+)", (REPO / ".ci" / "run").read_text()).group(1)
    assert f"torch=={ci_torch}" in joined


def test_the_config_says_what_ncu_needs():
    """The note on counter permissions and on ncu being on the image is in the file."""
    text = CONFIG.read_text()
    assert "NVreg_RestrictProfilingToAdminUsers=0" in text and "root" in text
    assert "ncu --version" in text and text.startswith("# ray up ray_cluster.yaml")
