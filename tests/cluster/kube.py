"""What a cluster test uses: kubectl and the API as the admin, the way to reach a pod's port,
to crash a pod's process, and to read its log, the same on the harness's cluster and on an
existing one (SNOOZE_TEST_KUBECONFIG)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import waits
import yaml
from cluster import LocalCluster


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 60.0) -> Any:
    """`waits.wait_for` at a real cluster's pace: a minute by default, five looks a second."""
    return waits.wait_for(what, predicate, timeout, every=0.2)


class Kube:
    """One cluster as the tests see it."""

    def __init__(self, kubeconfig: Path, *, kubectl: str, local: LocalCluster | None) -> None:
        self.kubeconfig = kubeconfig
        self.kubectl_path = kubectl
        self.local = local
        self.api = kubernetes.config.new_client_from_config(str(kubeconfig))
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.apps = kubernetes.client.AppsV1Api(self.api)
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        self.cache = Path(os.environ.get("SNOOZE_TEST_KUBECACHE", "/tmp")) / f"kc-{os.getpid()}"

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "KUBECACHEDIR": str(self.cache)}
        done = subprocess.run(
            [self.kubectl_path, *args], input=input, capture_output=True, text=True, env=env,
            timeout=timeout,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def kubectl_as(self, token: str, *args: str) -> subprocess.CompletedProcess[str]:
        """kubectl with only `token` as credentials (the admin's cluster entry, no client
        certificate: the API server would take the certificate first)."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
        token_config = {
            "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
            "users": [{"name": "token", "user": {"token": token}}],
            "contexts": [{"name": "token",
                          "context": {"cluster": cluster["name"], "user": "token"}}],
            "current-context": "token",
        }  # fmt: skip
        self.cache.mkdir(parents=True, exist_ok=True)
        path = self.cache / "token.kubeconfig"
        path.write_text(yaml.safe_dump(token_config))
        env = {**os.environ, "KUBECONFIG": str(path), "KUBECACHEDIR": str(self.cache)}
        try:
            return subprocess.run([self.kubectl_path, *args], capture_output=True, text=True,
                                  env=env, timeout=60)  # fmt: skip
        finally:
            path.unlink()

    def apply(self, manifest: str | dict[str, Any] | list[dict[str, Any]], *extra: str) -> str:
        text = manifest
        if isinstance(manifest, list):
            text = yaml.safe_dump_all(manifest)
        elif isinstance(manifest, dict):
            text = yaml.safe_dump(manifest)
        assert isinstance(text, str)
        return self.kubectl("apply", "-f", "-", *extra, input=text).stdout

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        args = ["get", kind, name, "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        done = self.kubectl(*args, check=False)
        if done.returncode != 0:
            return {}
        body: dict[str, Any] = json.loads(done.stdout)
        return body

    def delete_and_wait(self, namespace: str, selector: str, *objects: str) -> None:
        """Delete `objects` (kubectl's TYPE/NAME or -f FILE) and wait until no pod matches
        `selector`: the next test may make objects of the same names, whose new ReplicaSet
        would adopt the old pods the garbage collector has not removed yet."""
        self.kubectl("delete", "-n", namespace, "--ignore-not-found", *objects, check=False)
        wait_for(f"the pods of {selector} gone", lambda: not self.pods(namespace, selector))

    def pods(self, namespace: str, selector: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(namespace, label_selector=selector).items)

    def ready_pods(self, namespace: str, selector: str) -> list[Any]:
        out = []
        for pod in self.pods(namespace, selector):
            if pod.metadata.deletion_timestamp is not None:
                continue
            conditions = pod.status.conditions or []
            if any(c.type == "Ready" and c.status == "True" for c in conditions):
                out.append(pod)
        return out

    def url(self, pod: Any, port: int, path: str = "") -> str:
        """An address that reaches `port` of `pod`: its IP here; through the API server's pod
        proxy on an existing cluster, whose pod network the tests may not reach."""
        if self.local is not None:
            return f"http://{pod.status.pod_ip}:{port}{path}"
        host = self.api.configuration.host
        ns, name = pod.metadata.namespace, pod.metadata.name
        return f"{host}/api/v1/namespaces/{ns}/pods/{name}:{port}/proxy{path}"

    def http(self, timeout: float = 60) -> httpx.Client:
        """An HTTP client for `url()`s (with the admin's credentials on an existing cluster)."""
        if self.local is not None:
            return httpx.Client(timeout=timeout)
        config = self.api.configuration
        tls = ssl.create_default_context(cafile=config.ssl_ca_cert)
        if config.cert_file:
            tls.load_cert_chain(config.cert_file, config.key_file)
        headers = {"Authorization": config.api_key["authorization"]} if config.api_key else {}
        return httpx.Client(timeout=timeout, verify=tls, headers=headers)

    def crash(self, pod: Any, container: str | None = None) -> None:
        """Kill the pod's process with SIGKILL, as an out-of-memory kill or a node fault
        would: here its process; on an existing cluster, the pod, forced."""
        if self.local is None:
            self.kubectl("delete", "pod", "-n", pod.metadata.namespace, pod.metadata.name,
                         "--grace-period=0", "--force")  # fmt: skip
            return
        assert self.local.runtime is not None
        runner = self.local.runtime.runner(pod.metadata.namespace, pod.metadata.name)
        assert runner is not None, f"no process runs pod {pod.metadata.name}"
        for each in runner.containers:
            if container is None or each.spec.name == container:
                each.kill(signal.SIGKILL)

    def log(self, pod: Any, container: str | None = None) -> str:
        """What the pod's container printed (here from its log file; else kubectl logs)."""
        ns, name = pod.metadata.namespace, pod.metadata.name
        if self.local is None:
            args = ["logs", "-n", ns, name] + (["-c", container] if container else [])
            return self.kubectl(*args, check=False).stdout
        assert self.local.runtime is not None
        runner = self.local.runtime.runner(ns, name)
        if runner is None:
            return ""
        return "\n".join(
            c.log_path.read_text(errors="replace")
            for c in runner.containers
            if (container is None or c.spec.name == container) and c.log_path.exists()
        )

    def close(self) -> None:
        shutil.rmtree(self.cache, ignore_errors=True)
        self.api.close()
