"""Strategic merge patch over built-in kinds: each rule, then kubectl's own patches."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from builders import pod

from snooze.sandbox import Sandbox, schemas, strategic

POD = schemas.builtin()["io.k8s.api.core.v1.Pod"]
DEPLOYMENT = schemas.builtin()["io.k8s.api.apps.v1.Deployment"]


A = {"name": "a", "image": "1", "ports": [{"containerPort": 80}, {"containerPort": 90}]}
B = {"name": "b", "image": "2", "args": ["x", "y"]}


@pytest.mark.parametrize(
    ("target", "patch", "expected"),
    [
        # Containers merge by name: the other fields and the other container stay.
        (pod(A, B), {"spec": {"containers": [{"name": "a", "image": "3"}]}},
         pod(A | {"image": "3"}, B)),
        (pod(A, B), {"spec": {"containers": [{"name": "c", "image": "4"}]}},
         pod(A, B, {"name": "c", "image": "4"})),
        (pod(A, B), {"spec": {"containers": [{"name": "b", "$patch": "delete"}]}}, pod(A)),
        # Ports merge by containerPort; args (no strategy) are replaced.
        (pod(A), {"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 90,
                                                                   "name": "metrics"}]}]}},
         pod(A | {"ports": [{"containerPort": 80}, {"containerPort": 90, "name": "metrics"}]})),
        (pod(B), {"spec": {"containers": [{"name": "b", "args": ["z"]}]}},
         pod(B | {"args": ["z"]})),
        # The order kubectl asks for, and null removing a field.
        (pod(A, B), {"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}]}},
         pod(B, A)),
        (pod(A | {"command": ["sh"]}), {"spec": {"containers": [{"name": "a", "command": None}]}},
         pod(A)),
        # Maps merge; finalizers merge as a set, and $deleteFromPrimitiveList removes from it.
        (pod(A, labels={"x": "1", "y": "2"}), {"metadata": {"labels": {"x": None, "z": "3"}}},
         pod(A, labels={"y": "2", "z": "3"})),
        (pod(A, finalizers=["f1"]), {"metadata": {"finalizers": ["f1", "f2"]}},
         pod(A, finalizers=["f1", "f2"])),
        (pod(A, finalizers=["f1", "f2"]),
         {"metadata": {"$deleteFromPrimitiveList/finalizers": ["f1"]}},
         pod(A, finalizers=["f2"])),
        # $patch: replace takes the value as given.
        (pod(A, B), {"spec": {"$patch": "replace", "containers": [{"name": "c"}]}},
         pod({"name": "c"})),
    ],
)  # fmt: skip
def test_pod_patches(target: Any, patch: Any, expected: Any) -> None:
    assert strategic.apply(target, patch, POD, schemas.builtin()) == expected


def test_retain_keys_drop_what_the_patch_does_not_keep() -> None:
    deployment = {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}
    patch = {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}
    assert strategic.apply(deployment, patch, DEPLOYMENT, schemas.builtin()) == {
        "spec": {"strategy": {"type": "Recreate"}}
    }


def test_an_element_without_its_merge_key_is_refused() -> None:
    with pytest.raises(strategic.StrategicPatchError, match="merge key: name"):
        strategic.apply(pod(A), {"spec": {"containers": [{"image": "5"}]}}, POD, schemas.builtin())


@pytest.mark.needs("kubectl")
def test_kubectl_patches_keep_what_they_do_not_touch(sandbox: Sandbox, tmp_path: Path) -> None:
    config = sandbox.write_kubeconfig(tmp_path / "kubeconfig")
    env = {**os.environ, "KUBECONFIG": str(config), "KUBECACHEDIR": str(tmp_path / "cache")}

    def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", *args], env=env, input=stdin, capture_output=True,
                              text=True, timeout=60)  # fmt: skip

    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two"},
                "spec": {"containers": [A, B]}}  # fmt: skip
    assert kubectl("apply", "-f", "-", stdin=json.dumps(manifest)).returncode == 0
    # The apply of a changed manifest sends only the change, keyed by container name.
    manifest["spec"]["containers"] = [A | {"image": "1b"}, B]
    assert kubectl("apply", "-f", "-", stdin=json.dumps(manifest)).returncode == 0
    changed = kubectl("set", "image", "pod/two", "b=2b")
    assert changed.returncode == 0 and "Warning" not in changed.stderr, changed.stderr
    stored = json.loads(kubectl("get", "pod", "two", "-o", "json").stdout)["spec"]["containers"]
    assert stored == [A | {"image": "1b"}, B | {"image": "2b"}]
    assert kubectl("delete", "pod", "two").returncode == 0
