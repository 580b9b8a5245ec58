"""A real 3-master Redis Cluster on loopback free ports, for the tests; torn down after.

``RedisClusterFixture(directory)`` is three masters and no replicas (the core's cluster tests);
``RedisClusterFixture(directory, replicas=1, node_timeout=1000)`` gives each master a replica
and a short node timeout, so that after a master is killed its replica is promoted in about
1-3 s (``kill_master_of`` and ``wait_failover``).
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

from redis.asyncio import RedisCluster

from tests.faultproxy import FaultProxy
from tests.redis_server import RedisServer

REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def free_cluster_port() -> int:
    """A loopback port P with P + 10000 (the cluster bus) free too; Redis needs P <= 55535."""
    for _ in range(200):
        port = random.randrange(20_000, 45_000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10_000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisClusterFixture:
    """Three ``--cluster-enabled`` servers joined by ``redis-cli --cluster create``."""

    def __init__(self, directory: Path, masters: int = 3, *, replicas: int = 0, node_timeout: int = 2000) -> None:
        self.directory = directory
        self.replicas = replicas
        self.node_timeout = node_timeout
        self.nodes = [self._node(directory / f"node{i}") for i in range(masters * (1 + replicas))]

    def _node(self, directory: Path) -> RedisServer:
        config = str(directory / "nodes.conf")
        options = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", config,
            "--cluster-node-timeout", str(self.node_timeout),
        ]  # fmt: skip
        if self.replicas:
            # a replica may always take over (however long it was cut off), and syncs at once
            options += ["--cluster-replica-validity-factor", "0", "--repl-diskless-sync-delay", "0"]
        return RedisServer(directory, *options, port=free_cluster_port())

    @property
    def live_nodes(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.process is not None]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def cli(self, *args: str, port: int | None = None) -> str:
        port = port or self.live_nodes[0].port
        done = subprocess.run(
            [REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), *args], capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)} failed: {done.stderr or done.stdout}")
        return done.stdout

    def start(self) -> RedisClusterFixture:
        try:
            for node in self.nodes:
                node.start()
            self.cli(
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            )
            self._wait_ok()
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in self.cli("CLUSTER", "INFO", port=n.port) for n in self.live_nodes) and (
                not self.replicas or self._replicas_in_sync()
            ):
                return
            time.sleep(0.05)
        raise RuntimeError("the cluster did not reach cluster_state:ok")

    def _replicas_in_sync(self) -> bool:
        """Every node agrees on the replica count, and every replica's link to its master is up."""
        replicas = 0
        for node in self.live_nodes:
            info = self.cli("INFO", "replication", port=node.port)
            if "role:slave" in info:
                if "master_link_status:up" not in info:
                    return False
                replicas += 1
        return replicas == self.replicas * len(self.nodes) // (1 + self.replicas)

    def node_on(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def kill_master_of(self, key: str) -> tuple[int, int]:
        """kill -9 the master serving ``key``; returns (its slot, its port)."""
        slot = self.keyslot(key)
        port = self.port_of_slot(slot)
        self.node_on(port).kill()
        return slot, port

    def wait_failover(self, slot: int, old_port: int, within: float = 20.0) -> int:
        """Wait until another node serves ``slot`` and every live node says cluster_state:ok; its port."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                port = self.port_of_slot(slot)
                if port != old_port and all(
                    "cluster_state:ok" in self.cli("CLUSTER", "INFO", port=n.port) for n in self.live_nodes
                ):
                    return port
            except (RuntimeError, LookupError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"slot {slot} was not failed over from port {old_port} within {within}s")

    def port_of_slot(self, slot: int) -> int:
        """The port of the master serving ``slot`` (from CLUSTER SLOTS)."""
        lines = self.cli("CLUSTER", "SLOTS").split()
        # redis-cli prints each range as: start, end, ip, port, node id, ...
        for i in range(0, len(lines) - 3):
            if lines[i].isdigit() and lines[i + 1].isdigit() and lines[i + 2] == "127.0.0.1":
                start, end, port = int(lines[i]), int(lines[i + 1]), int(lines[i + 3])
                if start <= slot <= end:
                    return port
        raise LookupError(f"no master serves slot {slot}")

    def keyslot(self, key: str) -> int:
        return int(self.cli("CLUSTER", "KEYSLOT", key).strip())

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()


class ClusterProxies:
    """A FaultProxy in front of every node of a cluster, and RedisCluster clients that go through them.

    The nodes announce their own ports (CLUSTER SLOTS, MOVED), so a client is given
    ``address_remap=proxies.remap``: every node address it learns is mapped to that node's
    proxy. ``proxies.of(port)`` is the proxy of one node, to inject faults on it alone.
    """

    def __init__(self, cluster: RedisClusterFixture) -> None:
        self.by_port: dict[int, FaultProxy] = {}
        try:
            for node in cluster.nodes:
                self.by_port[node.port] = FaultProxy(node.port).start()
        except BaseException:
            self.stop()
            raise

    def remap(self, address: tuple[str, int]) -> tuple[str, int]:
        proxy = self.by_port.get(address[1])
        return ("127.0.0.1", proxy.port) if proxy is not None else address

    def of(self, port: int) -> FaultProxy:
        return self.by_port[port]

    def client(self, **options: object) -> RedisCluster:
        first = next(iter(self.by_port.values()))
        return RedisCluster(host="127.0.0.1", port=first.port, address_remap=self.remap, **options)

    def stop(self) -> None:
        for proxy in self.by_port.values():
            proxy.stop()

    def __enter__(self) -> ClusterProxies:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
