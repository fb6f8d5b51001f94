"""The harness itself: a taken port and a second cluster on the same machine are refused with a
message that says what to do, and a running cluster leaves nothing behind it is not asked to."""

from __future__ import annotations

import socket

import pytest
from cluster import LocalCluster
from controlplane import ClusterError, check_free
from kube import Kube
from network import NetworkError


def test_a_taken_port_is_named_with_its_component() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ClusterError) as refused:
            check_free("127.0.0.1", port, "etcd")
    message = str(refused.value)
    assert f"etcd cannot listen on 127.0.0.1:{port}" in message
    assert "ss -ltnp" in message


@pytest.mark.local_only  # it needs this machine's cluster lock
def test_a_second_cluster_on_the_machine_is_refused(kube: Kube) -> None:
    second = LocalCluster()
    with pytest.raises(NetworkError) as refused:
        second.start()
    assert "another test cluster runs on this machine" in str(refused.value)
    # The refused one removed nothing of the running one: its API still answers.
    assert kube.kubectl("get", "nodes").returncode == 0
