"""The pod network of a test cluster: a Linux bridge on the host and a network namespace per
pod, joined by a veth pair, so that every pod has an address of its own and its processes
listen on the ports its containers declare, as they would on a node with a CNI plugin.

It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip`. Everything it makes is
named with one prefix, so that what a killed run left behind is found and removed by the next.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

PREFIX = "snz"
"""Every bridge, veth and namespace this module makes starts with it."""

LOCK = Path("/run/lock/snooze-test-cluster.lock")


class NetworkError(RuntimeError):
    """The pod network cannot be made; the message says what to fix."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


class PodNetwork:
    """A bridge whose address is the last of `subnet` (KWOK hands out pod addresses from the
    first), and a namespace per pod address."""

    def __init__(self, subnet: str) -> None:
        self.subnet = ipaddress.ip_network(subnet)
        hosts = list(self.subnet.hosts())
        self.gateway = str(hosts[-1])
        self.bridge = f"{PREFIX}br0"
        self._lock: int | None = None
        self._namespaces: dict[str, str] = {}
        """Pod address -> the namespace that holds it."""

    def up(self) -> None:
        """Take the machine's lock, remove what a dead run left, and make the bridge."""
        if os.geteuid() != 0:
            raise NetworkError(
                "the cluster tests give each pod a network namespace, which needs root: "
                "run them as root (CI does), or point SNOOZE_TEST_KUBECONFIG at a cluster"
            )
        if shutil.which("ip") is None:
            raise NetworkError("iproute2's `ip` is missing: apt-get install iproute2")
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(LOCK).read_text().strip() or "unknown"
            os.close(self._lock)
            self._lock = None
            raise NetworkError(
                f"another test cluster runs on this machine (process {holder}): stop it, or "
                "wait for it to end"
            ) from None
        os.ftruncate(self._lock, 0)
        os.write(self._lock, f"{os.getpid()}\n".encode())
        self._remove_leftovers()
        self._check_subnet_free()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def _check_subnet_free(self) -> None:
        routes = _ip("-json", "route", "show").stdout
        for route in json.loads(routes or "[]"):
            dst = route.get("dst", "")
            if dst in ("", "default"):
                continue
            if ipaddress.ip_network(dst, strict=False).overlaps(self.subnet):
                raise NetworkError(
                    f"the pod subnet {self.subnet} overlaps the route {dst} on "
                    f"{route.get('dev')}: choose another with SNOOZE_CLUSTER_SUBNET"
                )

    def _remove_leftovers(self) -> None:
        for name in _ip("netns", "list").stdout.split():
            if name.startswith(PREFIX):
                # A killed run's pods may still run there: end them, then their namespace.
                for pid in _ip("netns", "pids", name, check=False).stdout.split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                _ip("netns", "del", name, check=False)
        _ip("link", "del", self.bridge, check=False)

    def attach(self, address: str, owner: str) -> str:
        """A namespace whose eth0 has `address`, routed through the bridge; `owner` (the
        pod's uid) names it. Returns the namespace's name."""
        if ipaddress.ip_address(address) not in self.subnet:
            raise NetworkError(f"pod address {address} is outside the pod subnet {self.subnet}")
        previous = self._namespaces.get(address)
        if previous is not None:
            # KWOK hands a deleted pod's address to the next pod: its namespace must go first.
            self.detach(address)
        digest = hashlib.sha256(owner.encode()).hexdigest()[:10]
        namespace = f"{PREFIX}-{digest}"
        host_end = f"{PREFIX}h{digest}"
        pod_end = f"{PREFIX}p{digest}"
        _ip("netns", "add", namespace)
        try:
            _ip("link", "add", host_end, "type", "veth", "peer", "name", pod_end)
            _ip("link", "set", host_end, "master", self.bridge)
            _ip("link", "set", host_end, "up")
            _ip("link", "set", pod_end, "netns", namespace)
            inside = ("netns", "exec", namespace, "ip")
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "link", "set", pod_end, "name", "eth0")
            # The address decides the MAC (as OVN-Kubernetes does: 0a:58 and the four octets):
            # KWOK gives a deleted pod's address to the next one, and neighbours that cached
            # the old MAC would otherwise send to nowhere until their ARP entry expired.
            octets = ipaddress.ip_address(address).packed
            mac = "0a:58:" + ":".join(f"{b:02x}" for b in octets)
            _ip(*inside, "link", "set", "eth0", "address", mac)
            _ip(*inside, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
            _ip(*inside, "link", "set", "eth0", "up")
            _ip(*inside, "route", "add", "default", "via", self.gateway)
        except NetworkError:
            _ip("netns", "del", namespace, check=False)
            raise
        self._namespaces[address] = namespace
        return namespace

    def detach(self, address: str) -> None:
        """Remove the namespace of `address` (its veth pair goes with it)."""
        namespace = self._namespaces.pop(address, None)
        if namespace is not None:
            _ip("netns", "del", namespace, check=False)

    def down(self) -> None:
        """Remove every namespace and the bridge, and release the machine's lock; nothing
        when this network never took the lock (another run's network is not ours)."""
        if self._lock is None:
            return
        for address in list(self._namespaces):
            self.detach(address)
        self._remove_leftovers()
        os.close(self._lock)
        self._lock = None
