"""The Ray cluster launcher configs (`ray up`) validate against the schema Ray ships, and use our pinned Ray.

`ray up` has no dry run; `prepare_config` + `validate_config` (ray.autoscaler._private.util, a private API: Ray is
pinned to 2.60.x) are what `ray up` runs before it touches the cloud: defaults merged, then the JSON schema in
ray/autoscaler/ray-schema.json. No network, no credentials.
"""
from __future__ import annotations

import copy
import re

import pytest
import ray
import tomllib
import yaml
from _infra_checks import CLUSTER_YAMLS, INFRA, REPO, all_images, pinned, ray_version_of_image
from ray.autoscaler._private.util import prepare_config, validate_config

IDS = [p.parent.name for p in CLUSTER_YAMLS]


def test_there_are_cluster_yamls():
    assert {p.parent.name for p in CLUSTER_YAMLS} >= {"aws"}


@pytest.mark.parametrize("path", CLUSTER_YAMLS, ids=IDS)
def test_validates_against_rays_schema(path):
    config = yaml.safe_load(path.read_text())
    validate_config(prepare_config(copy.deepcopy(config)))


@pytest.mark.parametrize("path", CLUSTER_YAMLS, ids=IDS)
def test_the_validator_catches_a_typo(path):
    # The check above could be vacuous (a schema that accepts anything): a misspelt node-type field must fail.
    config = yaml.safe_load(path.read_text())
    node_type = next(iter(config["available_node_types"].values()))
    node_type["min_worker"] = node_type.pop("min_workers", 0)
    with pytest.raises(Exception, match="min_worker"):
        validate_config(prepare_config(config))


@pytest.mark.parametrize("path", CLUSTER_YAMLS, ids=IDS)
def test_groups_head_and_images(path):
    config = yaml.safe_load(path.read_text())
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0, "the head is a CPU node"
    gpu = [t for name, t in types.items() if t["resources"].get("GPU", 0) >= 8]
    cpu = [t for name, t in types.items() if name != config["head_node_type"] and not t["resources"].get("GPU")]
    assert gpu and cpu, "an 8-GPU group for pre-training and a CPU group for dataset builds"
    for t in gpu + cpu:
        assert t.get("min_workers", 0) == 0 < t["max_workers"], "worker groups autoscale from zero"
    # The dashboard and job server stay on the head's loopback (reached through `ray dashboard`'s SSH tunnel).
    start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in start
    images = all_images(config)
    assert images and all(ray_version_of_image(i) == ray.__version__ for i in images), images
    assert any(i.endswith("-gpu") for i in images) and any(i.endswith("-cpu") for i in images)


@pytest.mark.parametrize("path", CLUSTER_YAMLS, ids=IDS)
def test_setup_commands_install_this_project_with_the_constraints(path):
    config = yaml.safe_load(path.read_text())
    # The project, and the cluster's Ray token (tests/infra/test_security.py checks how it is used).
    assert config["file_mounts"] == {"~/bert-pretrain": ".", "~/.ray/auth_token": "~/.ray/auth_token"}
    for group in [config] + list(config["available_node_types"].values()):
        for key in ("head_setup_commands", "worker_setup_commands"):
            for cmd in group.get(key, []):
                m = re.fullmatch(r"bash ~/bert-pretrain/(\S+) (cpu|gpu) ~/bert-pretrain", cmd)
                assert m, cmd
                assert (REPO / m.group(1)).is_file()
    # rsync must not drop what the setup script reads.
    assert "constraints.txt" not in " ".join(config.get("rsync_exclude", []))
    assert ".gitignore" not in config.get("rsync_filter", [])


def test_versions_agree_everywhere():
    """Image tags, the installed Ray, constraints.txt and pyproject's range name one Ray version."""
    assert pinned("ray") == ray.__version__
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    ray_dep = next(d for d in deps if d.startswith("ray["))
    lo, hi = re.search(r">=([\d.]+),<([\d.]+)", ray_dep).groups()
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert as_tuple(lo) <= as_tuple(ray.__version__) < as_tuple(hi), ray_dep
    dockerfile = (INFRA / "docker" / "Dockerfile").read_text()
    assert f"FROM rayproject/ray:{ray.__version__}-py311-" in dockerfile
    setup = (INFRA / "setup_node.sh").read_text()
    assert "constraints.txt" in setup and "-c " in setup
