"""The Inference Extension on the sandbox, as the operator sees it: a test-only InferencePool CRD
of our own (the real one, from the Inference Extension's module, is used by the cluster tier),
the objects that name a picker (its Service and EndpointSlice, which no controller makes here),
and a stand-in for the picker's metrics port.

The stand-in serves the real gauge's name and labels (`inference_extension_flow_control_queue_
size{fairness_id, priority, inference_pool, model_name, target_model_name}`, as release v1.5.0
writes it) among other metrics, behind a bearer token as the picker's metrics are guarded (401
without an accepted token, 403 for one it may not use); or, asked to, it answers as a hostile
or broken picker would: a page too large, one that never ends, garbage, a NaN.
"""

from __future__ import annotations

import http.server
import socketserver
import threading
import time
from typing import Any

from tests.e2e.conftest import Cluster

GROUP = "inference.networking.k8s.io"
POOLS = "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools"
QUEUE = "inference_extension_flow_control_queue_size"

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"inferencepools.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {
            "plural": "inferencepools",
            "singular": "inferencepool",
            "kind": "InferencePool",
            "listKind": "InferencePoolList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "selector": {
                                        "type": "object",
                                        "properties": {
                                            "matchLabels": {
                                                "type": "object",
                                                "additionalProperties": {"type": "string"},
                                            }
                                        },
                                    },
                                    "targetPorts": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "properties": {"number": {"type": "integer"}},
                                        },
                                    },
                                    "endpointPickerRef": {
                                        "type": "object",
                                        "properties": {
                                            "group": {"type": "string"},
                                            "kind": {"type": "string"},
                                            "name": {"type": "string"},
                                            "port": {
                                                "type": "object",
                                                "properties": {"number": {"type": "integer"}},
                                            },
                                            "failureMode": {"type": "string"},
                                        },
                                    },
                                },
                            },
                            "status": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    }
                },
            }
        ],
    },
}


def install_crd(cluster: Cluster) -> None:
    url = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    cluster._check(cluster.http.post(url, json=CRD))


def create_pool(
    cluster: Cluster,
    name: str,
    *,
    selector: dict[str, str],
    picker: str,
    kind: str = "Service",
    annotations: dict[str, str] | None = None,
) -> None:
    meta: dict[str, Any] = {"name": name, "namespace": cluster.ns}
    if annotations:
        meta["annotations"] = annotations
    body = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "InferencePool",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": selector},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"kind": kind, "name": picker, "port": {"number": 9002}},
        },
    }
    cluster._check(cluster.http.post(POOLS.format(ns=cluster.ns), json=body))


def create_picker_service(
    cluster: Cluster,
    name: str,
    addresses: list[str],
    *,
    port: int,
    ready: bool = True,
    port_name: str = "http-metrics",
    pods: bool = True,
) -> None:
    """The picker's Service, as its chart makes it (ports grpc-ext-proc and http-metrics), its
    pods at `addresses` (unless not `pods`: an EndpointSlice written by hand, pointing
    elsewhere), and the EndpointSlice that the EndpointSlice controller would make for them."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": cluster.ns},
        "spec": {
            "selector": {"app": name},
            "ports": [
                {"name": "grpc-ext-proc", "port": 9002, "protocol": "TCP"},
                {"name": port_name, "port": 9090, "targetPort": port, "protocol": "TCP"},
            ],
        },
    }
    cluster._check(cluster.http.post(f"/api/v1/namespaces/{cluster.ns}/services", json=service))
    for n, address in enumerate(addresses if pods else []):
        add_picker_pod(cluster, f"{name}-{n}", address, labels={"app": name})
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{name}-abcde",
            "namespace": cluster.ns,
            "labels": {"kubernetes.io/service-name": name},
        },
        "addressType": "IPv4",
        "ports": [
            {"name": "grpc-ext-proc", "port": 9002, "protocol": "TCP"},
            {"name": port_name, "port": port, "protocol": "TCP"},
        ],
        "endpoints": [{"addresses": [a], "conditions": {"ready": ready}} for a in addresses],
    }
    url = f"/apis/discovery.k8s.io/v1/namespaces/{cluster.ns}/endpointslices"
    cluster._check(cluster.http.post(url, json=endpoints))


def add_picker_pod(cluster: Cluster, name: str, address: str, *, labels: dict[str, str]) -> None:
    """A picker's pod, Running at `address` (where its stand-in listens)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": cluster.ns, "labels": labels},
        "spec": {"containers": [{"name": "epp", "image": "epp"}]},
    }
    cluster._check(cluster.http.post(f"/api/v1/namespaces/{cluster.ns}/pods", json=pod))
    status = {
        "phase": "Running",
        "podIP": address,
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    cluster._check(
        cluster.http.patch(
            f"/api/v1/namespaces/{cluster.ns}/pods/{name}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    )


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the operator hangs up on a page it will not read: that is the point


class PickerMetrics:
    """A stand-in for one picker replica's metrics port, on (host, port)."""

    def __init__(self, host: str, port: int, *, token: str) -> None:
        self.token = token
        self.forbidden: set[str] = set()
        """Tokens it authenticates but does not let read (403, as a SubjectAccessReview denies)."""
        self.queued: dict[tuple[str, str, str], int] = {}
        """(target model, fairness id, priority) -> requests in its queue."""
        self.mode = "ok"
        """ok, huge, endless, garbage or nan."""
        self.asked: dict[str, int] = {"accepted": 0, "no token": 0, "refused": 0}
        self._stop = threading.Event()
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                stand_in.serve(self)

        self.server = _Server((host, port), Handler)
        self.url = f"http://{host}:{port}/metrics"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()

    def page(self) -> bytes:
        lines = [
            "# HELP inference_objective_request_total Counter of inference objective requests.",
            "# TYPE inference_objective_request_total counter",
            'inference_objective_request_total{model_name="m",target_model_name="m"} 7',
            f"# HELP {QUEUE} Current number of requests actively held in the Flow Control queue.",
            f"# TYPE {QUEUE} gauge",
        ]
        for (target, fairness, priority), count in sorted(self.queued.items()):
            value = "NaN" if self.mode == "nan" else str(count)
            lines.append(
                f'{QUEUE}{{fairness_id="{fairness}",inference_pool="pool",model_name="{target}",'
                f'priority="{priority}",target_model_name="{target}"}} {value}'
            )
        return ("\n".join(lines) + "\n").encode()

    def serve(self, request: http.server.BaseHTTPRequestHandler) -> None:
        scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
        if scheme != "Bearer" or not token:
            self.asked["no token"] += 1
            return self._answer(request, 401, b"Unauthorized\n")
        if token != self.token and token not in self.forbidden:
            self.asked["refused"] += 1
            return self._answer(request, 401, b"Unauthorized\n")
        if token in self.forbidden:
            self.asked["refused"] += 1
            return self._answer(request, 403, b"Authorization denied for user\n")
        self.asked["accepted"] += 1
        if self.mode in ("ok", "nan"):
            return self._answer(request, 200, self.page())
        request.send_response(200)
        request.send_header("Content-Type", "text/plain; version=0.0.4")
        request.send_header("Transfer-Encoding", "chunked")
        request.end_headers()
        try:
            if self.mode == "garbage":  # binary noise, in the gauge's own lines too
                noise = bytes(range(256)) * 16
                self._chunk(request, noise + b"\n" + QUEUE.encode() + b"{" + noise + b"} 1\n")
            elif self.mode == "huge":  # past the most the operator reads, chunk by chunk
                line = b"# " + b"x" * 1022 + b"\n"
                for _ in range(17 * 64):
                    self._chunk(request, line * 16)
            elif self.mode == "endless":  # a line now and then, never an end
                while not self._stop.is_set():
                    self._chunk(request, b"# still here\n")
                    time.sleep(0.2)
            self._chunk(request, b"")
        except OSError:
            pass  # the operator hung up: what it should do with such a page

    @staticmethod
    def _chunk(request: http.server.BaseHTTPRequestHandler, data: bytes) -> None:
        request.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        request.wfile.flush()

    @staticmethod
    def _answer(request: http.server.BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        request.send_response(status)
        request.send_header("Content-Type", "text/plain; version=0.0.4")
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
