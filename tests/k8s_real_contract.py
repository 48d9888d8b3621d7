"""The driver contract against a real Kubernetes cluster: run by scripts/k8s-check.sh (not
collected with the suite: no cluster runs on the machines the suite runs on).

KUBECONFIG (its current context, or MONKEY_K8S_CONTEXT) names the cluster, MONKEY_K8S_NAMESPACE
the namespace (default: the context's), MONKEY_K8S_IMAGE an image the cluster can pull that
has sh and python3 (default python:3.12-alpine: monkey's agent runs in the pod with it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from driver_contract import DriverContract, Target, provider, serve


class TestRealClusterContract(DriverContract):
    @pytest.fixture
    def target(self, home: Path) -> Iterator[Target]:  # the fixture
        entry = {
            "type": "kubernetes",
            "kubeconfig": os.path.abspath(
                os.path.expanduser(os.environ.get("KUBECONFIG", "~/.kube/config").split(":")[0])
            ),
            "image": os.environ.get("MONKEY_K8S_IMAGE", "python:3.12-alpine"),
            "schedule_timeout": 300,
        }
        for key, name in (("context", "MONKEY_K8S_CONTEXT"), ("namespace", "MONKEY_K8S_NAMESPACE")):
            if os.environ.get(name):
                entry[key] = os.environ[name]
        yield from serve(provider(home, "cluster", entry), home, ["cluster"])
