"""The harness's part of the kubelet: it runs each Pod bound to the test node as processes in
the Pod's own network namespace, probes them, and reports them through the Pod's status.

KWOK (tests/cluster/kwok.yaml) keeps the Node Ready and gives each Pod its address; this
runtime starts the containers once the address is there. A container's image is looked up in
`images`, which maps an image name (without tag) to the entry point and environment of the
image built from this repository (images/operator/Dockerfile), run from the tree under test.

What it does as a kubelet does: the service account token mounted where in-cluster clients
read it (a TokenRequest bound to the Pod), KUBERNETES_SERVICE_HOST and _PORT, env (values and
the Downward API's fieldRefs), emptyDir, hostPath, configMap and secret volumes, readiness
and liveness probes (probes.py), Ready from the containers and the readiness gates
(readiness.py), restarts with a back-off and restartCount, SIGTERM on deletion then SIGKILL
when the grace period ends, and the final delete. What it does not: pull images, enforce
securityContext or resources (every container runs as root), serve logs or exec, or run
other images; readiness probes run every second at most, and the restart back-off is 1 s
doubling to 10 s (the kubelet's is 10 s to 5 min), so that tests wait less.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import readiness
from kubernetes.client.rest import ApiException
from network import PodNetwork
from probes import Probe
from volumes import project

log = logging.getLogger("cluster.kubelet")

SERVICE_ACCOUNT_DIR = "/run/secrets/kubernetes.io/serviceaccount"
PROJECTED = "/run/.kubelet-volumes"


@dataclass(frozen=True)
class Image:
    """What running an image means here: its entry point, its environment, its default args."""

    entrypoint: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cmd: list[str] = field(default_factory=list)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _image_name(image: str) -> str:
    # registry/name:tag or name@sha256:...: the name is what the runtime knows.
    name = image.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    return name


@dataclass
class Container:
    """One container of a Pod and its process."""

    spec: Any
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    started_at: str = ""
    restarts: int = 0
    ready: bool = False
    backoff_until: float = 0.0
    last_exit: dict[str, Any] | None = None
    readiness: Probe | None = None
    liveness: Probe | None = None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig: int) -> None:
        if self.running():
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)


class PodRunner:
    """Runs one Pod until it is deleted or the runtime stops."""

    def __init__(self, runtime: Runtime, pod: Any) -> None:
        self.runtime = runtime
        self.pod = pod
        self.uid: str = pod.metadata.uid
        self.key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        self.address: str | None = None
        self.containers: list[Container] = []
        self.gone = threading.Event()
        self.deleting = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"pod {self.key}", daemon=True)
        self.last_status: dict[str, Any] | None = None
        self.projected: list[Any] = []
        self.projected_at = 0.0

    def update(self, pod: Any) -> None:
        self.pod = pod
        if pod.metadata.deletion_timestamp is not None:
            self.deleting.set()

    # -- the pod's life --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if not self._wait_for_address():
                return
            self._prepare()
            while not self.gone.is_set() and not self.runtime.stopping.is_set():
                if self.deleting.is_set():
                    self._terminate()
                    return
                self._tend()
                self.gone.wait(0.2)
        except Exception:
            log.exception("pod %s: the runtime failed", self.key)
        finally:
            self._stop_containers(grace=5.0)
            if self.address is not None:
                self.runtime.release(self.address, self)

    def _wait_for_address(self) -> bool:
        while not self.gone.is_set() and not self.runtime.stopping.is_set():
            if self.deleting.is_set():
                self._final_delete()
                return False
            status = self.pod.status
            if status is not None and status.pod_ip:
                self.address = status.pod_ip
                return True
            self.gone.wait(0.1)
        return False

    def _prepare(self) -> None:
        assert self.address is not None
        pod = self.pod
        self.netns = self.runtime.attach(self.address, self)
        self.dir = (
            self.runtime.workdir
            / "pods"
            / f"{pod.metadata.namespace}_{pod.metadata.name}_{self.uid[:8]}"
        )
        self.dir.mkdir(parents=True, exist_ok=True)
        sa_dir = self.dir / "serviceaccount"
        sa_dir.mkdir(exist_ok=True)
        (self.dir / "volumes").mkdir(exist_ok=True)
        if pod.spec.automount_service_account_token is not False:
            (sa_dir / "token").write_text(self.runtime.token_for(pod))
        (sa_dir / "ca.crt").write_bytes(self.runtime.ca.read_bytes())
        (sa_dir / "namespace").write_text(pod.metadata.namespace)
        volumes = {v.name: v for v in pod.spec.volumes or []}
        for spec in pod.spec.containers:
            image = self.runtime.image(spec.image)
            if image is None:
                self._report_bad_image(spec)
                continue
            command = list(spec.command or image.entrypoint)
            args = list(spec.args if spec.args is not None else ([] if spec.command else image.cmd))
            # The pod's own folder is bound at PROJECTED first: an emptyDir over /tmp, where
            # the folder lives, would hide the sources of its configMap and secret volumes.
            folder = shlex.quote(str(self.dir / "volumes"))
            prelude = ["set -e", "mount -t tmpfs -o mode=0755 tmpfs /run",
                       f"mkdir -p {SERVICE_ACCOUNT_DIR} {PROJECTED}",
                       f"cp {shlex.quote(str(sa_dir))}/* {SERVICE_ACCOUNT_DIR}/",
                       f"mount --bind {folder} {PROJECTED}"]  # fmt: skip
            for mount in spec.volume_mounts or []:
                volume = volumes.get(mount.name)
                target = shlex.quote(mount.mount_path)
                if volume is not None and volume.empty_dir is not None:
                    prelude.append(f"mount -t tmpfs tmpfs {target}")
                elif volume is not None and (volume.config_map or volume.secret) is not None:
                    self._mounted(volume)
                    source = shlex.quote(f"{PROJECTED}/{volume.name}")
                    prelude += [f"mkdir -p {target}", f"mount --bind -o ro {source} {target}"]
                elif volume is not None and volume.host_path is not None:
                    # DirectoryOrCreate; the mount point is made inside the pod's own /run or
                    # /tmp where it can be (a tmpfs of this mount namespace, not the host's).
                    source = shlex.quote(volume.host_path.path)
                    prelude += [f"mkdir -p {source} {target}", f"mount --bind {source} {target}"]
            prelude.append('exec "$@"')
            # The pod's own host name, as its own UTS namespace gives it in a cluster.
            prelude.insert(1, f"hostname {shlex.quote(pod.metadata.name[:63])}")
            argv = [
                "ip", "netns", "exec", self.netns,
                "unshare", "--mount", "--uts", "--propagation", "private", "--",
                "sh", "-c", "\n".join(prelude), "sh", *command, *args,
            ]  # fmt: skip
            env = {**self.runtime.base_env, **image.env, **self._env(spec)}
            ports = {p.name: p.container_port for p in spec.ports or [] if p.name}
            container = Container(
                spec=spec, argv=argv, env=env, log_path=self.dir / f"{spec.name}.log"
            )
            if spec.readiness_probe is not None:
                period = min(float(spec.readiness_probe.period_seconds or 10), 1.0)
                container.readiness = Probe(spec.readiness_probe, ports, period)
            if spec.liveness_probe is not None:
                period = float(spec.liveness_probe.period_seconds or 10)
                container.liveness = Probe(spec.liveness_probe, ports, period)
            self.containers.append(container)

    def _mounted(self, volume: Any) -> None:
        """The volume's files, once its object can be read: until then (not made yet, or the
        API server away) the pod waits, as the kubelet's containers wait for their volumes."""
        while True:
            try:
                self._project(volume)
                return
            except Exception as error:  # ApiException, or no answer at all
                log.info("pod %s: volume %s not ready: %s", self.key, volume.name, error)
                if self.gone.wait(0.5) or self.deleting.is_set():
                    raise

    def _project(self, volume: Any) -> None:
        project(self.runtime.core, self.pod.metadata.namespace, volume, self.dir / "volumes")
        if volume not in self.projected:
            self.projected.append(volume)

    def _env(self, spec: Any) -> dict[str, str]:
        pod = self.pod
        fields = {
            "metadata.name": pod.metadata.name,
            "metadata.namespace": pod.metadata.namespace,
            "metadata.uid": pod.metadata.uid,
            "spec.nodeName": pod.spec.node_name or "",
            "spec.serviceAccountName": pod.spec.service_account_name or "",
            "status.podIP": self.address or "",
            "status.hostIP": self.runtime.network.gateway,
        }
        env = {"HOSTNAME": pod.metadata.name}
        for item in spec.env or []:
            if item.value is not None:
                env[item.name] = item.value
            elif item.value_from is not None and item.value_from.field_ref is not None:
                env[item.name] = fields.get(item.value_from.field_ref.field_path, "")
        return env

    def _report_bad_image(self, spec: Any) -> None:
        # As a kubelet reports an image it cannot pull: the container waits, the pod never runs.
        self._patch(
            {
                "containerStatuses": [
                    {"name": spec.name, "image": spec.image, "imageID": "", "ready": False,
                     "restartCount": 0, "started": False,
                     "state": {"waiting": {"reason": "ErrImagePull", "message":
                               f"the test runtime runs only {sorted(self.runtime.images)}"}}}
                ]
            }
        )  # fmt: skip

    def _start(self, container: Container) -> None:
        out = container.log_path.open("ab")
        container.popen = subprocess.Popen(
            container.argv, env=container.env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        out.close()
        container.started = time.monotonic()
        container.started_at = _now()
        container.ready = container.readiness is None
        if container.readiness is not None:
            container.readiness.failures = container.readiness.successes = 0
        if container.liveness is not None:
            container.liveness.failures = container.liveness.successes = 0

    def _tend(self) -> None:
        now = time.monotonic()
        assert self.address is not None
        if self.projected and now - self.projected_at >= 2.0:
            self.projected_at = now
            for volume in self.projected:
                # The API server may be away (a test restarts it): the files stay as they are.
                with contextlib.suppress(Exception):
                    self._project(volume)
        for container in self.containers:
            if container.popen is None:
                self._start(container)
                continue
            if not container.running():
                if container.backoff_until == 0.0:
                    code = container.popen.returncode
                    container.last_exit = {
                        "exitCode": code if code >= 0 else 128 - code,
                        "reason": "Completed" if code == 0 else "Error",
                        "startedAt": container.started_at,
                        "finishedAt": _now(),
                    }
                    container.ready = False
                    delay = min(1.0 * 2**container.restarts, 10.0)
                    container.backoff_until = now + delay
                    log.info("pod %s: container %s exited (%s); restart in %.0f s",
                             self.key, container.spec.name, code, delay)  # fmt: skip
                elif now >= container.backoff_until:
                    container.backoff_until = 0.0
                    container.restarts += 1
                    self._start(container)
                continue
            if container.liveness is not None and container.liveness.due(container.started, now):
                container.liveness.check(self.address)
                threshold = container.liveness.spec.failure_threshold or 3
                if container.liveness.failures >= threshold:
                    log.info("pod %s: container %s failed its liveness probe: restarting",
                             self.key, container.spec.name)  # fmt: skip
                    container.kill(signal.SIGKILL)
                    continue
            probe = container.readiness
            if probe is not None and probe.due(container.started, now):
                ok = probe.check(self.address)
                if ok and probe.successes >= (probe.spec.success_threshold or 1):
                    container.ready = True
                if not ok and probe.failures >= (probe.spec.failure_threshold or 3):
                    container.ready = False
        self._report()

    def _report(self) -> None:
        statuses = []
        for container in self.containers:
            state: dict[str, Any]
            if container.running():
                state = {"running": {"startedAt": container.started_at}}
            elif container.backoff_until:
                state = {"waiting": {"reason": "CrashLoopBackOff"}}
            else:
                state = {"waiting": {"reason": "ContainerCreating"}}
            entry: dict[str, Any] = {
                "name": container.spec.name, "image": container.spec.image, "imageID": "",
                "ready": container.ready, "started": container.running(),
                "restartCount": container.restarts, "state": state,
            }  # fmt: skip
            if container.last_exit is not None:
                entry["lastState"] = {"terminated": container.last_exit}
            statuses.append(entry)
        if not statuses:
            return
        unready = [c.spec.name for c in self.containers if not c.ready]
        # Ready also waits for every readiness gate's condition, which others write.
        gates = readiness.gates_unready(self.pod)
        ready = not unready and not gates
        # Once a container started, the pod is Running, through restarts, as the kubelet says.
        started = any(c.started for c in self.containers)
        status = {"phase": "Running" if started else "Pending",
                  "containerStatuses": statuses, "ready": ready, "gates": gates}  # fmt: skip
        if status == self.last_status and self._api_agrees(ready):
            return
        conditions = readiness.conditions(unready, gates, _now())
        if self._patch({"phase": status["phase"], "containerStatuses": statuses,
                        "conditions": conditions}):  # fmt: skip
            self.last_status = status

    def _api_agrees(self, ready: bool) -> bool:
        """Whether the pod as last watched says what this runtime said: another writer (the
        node lifecycle controller, after missed heartbeats) may have marked it not ready, and
        the kubelet's status manager writes its own view back."""
        conditions = (self.pod.status.conditions if self.pod.status else None) or []
        said = next((c.status for c in conditions if c.type == "Ready"), None)
        return said == ("True" if ready else "False")

    def _patch(self, status: dict[str, Any]) -> bool:
        try:
            self.runtime.core.patch_namespaced_pod_status(
                self.pod.metadata.name, self.pod.metadata.namespace, {"status": status}
            )
            return True
        except ApiException as error:
            if error.status == 404:
                self.gone.set()
            else:
                log.warning("pod %s: status not written: %s", self.key, error.reason)
            return False

    def _terminate(self) -> None:
        grace = self.pod.metadata.deletion_grace_period_seconds
        self._stop_containers(grace=30.0 if grace is None else float(grace))
        self._final_delete()

    def _stop_containers(self, *, grace: float) -> None:
        """SIGTERM, then SIGKILL for what still runs when `grace` is over (or the pod is gone)."""
        for container in self.containers:
            container.kill(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(c.running() for c in self.containers):
            time.sleep(0.05)
        for container in self.containers:
            container.kill(signal.SIGKILL)
            if container.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    container.popen.wait(5)

    def _final_delete(self) -> None:
        # As the kubelet does once the containers have stopped: delete now, this very pod.
        body = kubernetes.client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=kubernetes.client.V1Preconditions(uid=self.uid)
        )
        with contextlib.suppress(ApiException):
            self.runtime.core.delete_namespaced_pod(
                self.pod.metadata.name, self.pod.metadata.namespace, body=body
            )


class Runtime:
    """Runs every Pod bound to `node`, from a watch of the API as `client` sees it."""

    def __init__(
        self,
        *,
        client: kubernetes.client.ApiClient,
        node: str,
        network: PodNetwork,
        workdir: Path,
        images: dict[str, Image],
        api_host: str,
        api_port: int,
        ca: Path,
    ) -> None:
        self.client = client
        self.core = kubernetes.client.CoreV1Api(client)
        self.node = node
        self.network = network
        self.workdir = workdir
        self.images = images
        self.ca = ca
        self.base_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "KUBERNETES_SERVICE_HOST": api_host,
            "KUBERNETES_SERVICE_PORT": str(api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(api_port),
        }
        self.pods: dict[str, PodRunner] = {}
        self._by_address: dict[str, PodRunner] = {}
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="kubelet watch", daemon=True)

    def start(self) -> None:
        self._watcher.start()

    def image(self, reference: str) -> Image | None:
        """What runs `reference`: an image the runtime knows by name, or any image named
        .../snooze (what a user pushed from images/operator/Dockerfile, as the install docs'
        commands name it), which is this tree."""
        name = _image_name(reference)
        if name in self.images:
            return self.images[name]
        if name.rsplit("/", 1)[-1] == "snooze":
            return next(iter(self.images.values()))
        return None

    def token_for(self, pod: Any) -> str:
        """A token of the pod's service account, bound to the pod, as the kubelet projects it."""
        request = kubernetes.client.AuthenticationV1TokenRequest(
            spec=kubernetes.client.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=3600,
                bound_object_ref=kubernetes.client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
                ),
            )
        )
        answer = self.core.create_namespaced_service_account_token(
            pod.spec.service_account_name or "default", pod.metadata.namespace, request
        )
        return str(answer.status.token)

    def attach(self, address: str, runner: PodRunner) -> str:
        with self._lock:
            previous = self._by_address.get(address)
        if previous is not None and previous is not runner:
            # KWOK gave the address of a pod that is going away to a new one: let it go first.
            previous.gone.set()
            previous.thread.join(30)
        with self._lock:
            self._by_address[address] = runner
            return self.network.attach(address, runner.uid)

    def release(self, address: str, runner: PodRunner) -> None:
        with self._lock:
            if self._by_address.get(address) is runner:
                del self._by_address[address]
                self.network.detach(address)

    def _watch(self) -> None:
        selector = f"spec.nodeName={self.node}"
        version = ""
        while not self.stopping.is_set():
            try:
                if not version:
                    listed = self.core.list_pod_for_all_namespaces(field_selector=selector)
                    version = listed.metadata.resource_version
                    seen = set()
                    for pod in listed.items:
                        seen.add(pod.metadata.uid)
                        self._event("MODIFIED", pod)
                    for uid in set(self.pods) - seen:
                        self._event("DELETED", self.pods[uid].pod)
                stream = kubernetes.watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=version,
                    timeout_seconds=30,
                    allow_watch_bookmarks=True,
                )
                for event in stream:
                    if self.stopping.is_set():
                        return
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        version = ""
                        break
                    if event["type"] == "BOOKMARK":
                        # A bookmark comes as a plain object: only its resourceVersion counts.
                        raw = event.get("raw_object") or {}
                        version = raw.get("metadata", {}).get("resourceVersion", version)
                        continue
                    version = obj.metadata.resource_version
                    self._event(event["type"], obj)
            except ApiException as error:
                if error.status == 410:
                    version = ""
                    continue
                log.warning("pod watch failed: %s; again in 1 s", error.reason)
                self.stopping.wait(1)
            except Exception as error:  # the API server restarts in some tests
                log.info("pod watch broke (%s); again in 1 s", error)
                version = ""
                self.stopping.wait(1)

    def _event(self, kind: str, pod: Any) -> None:
        uid = pod.metadata.uid
        runner = self.pods.get(uid)
        if kind == "DELETED":
            if runner is not None:
                runner.gone.set()
                del self.pods[uid]
            return
        if runner is None:
            runner = PodRunner(self, pod)
            self.pods[uid] = runner
            runner.update(pod)
            runner.thread.start()
        else:
            runner.update(pod)

    def stop(self) -> None:
        self.stopping.set()
        for runner in list(self.pods.values()):
            runner.gone.set()
        for runner in list(self.pods.values()):
            runner.thread.join(15)
        self._watcher.join(5)

    def runner(self, namespace: str, name: str) -> PodRunner | None:
        for runner in self.pods.values():
            if runner.pod.metadata.namespace == namespace and runner.pod.metadata.name == name:
                return runner
        return None
