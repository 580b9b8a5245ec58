"""A real 3-master Redis Cluster on loopback free ports, for the tests; torn down after."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

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

    def __init__(self, directory: Path, masters: int = 3) -> None:
        self.directory = directory
        self.nodes = [self._node(directory / f"node{i}") for i in range(masters)]

    @staticmethod
    def _node(directory: Path) -> RedisServer:
        config = str(directory / "nodes.conf")
        options = ["--cluster-enabled", "yes", "--cluster-config-file", config, "--cluster-node-timeout", "2000"]
        return RedisServer(directory, *options, port=free_cluster_port())

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def cli(self, *args: str, port: int | None = None) -> str:
        port = port or self.nodes[0].port
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
                "0",
                "--cluster-yes",
            )
            self._wait_ok()
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in self.cli("CLUSTER", "INFO", port=n.port) for n in self.nodes):
                return
            time.sleep(0.05)
        raise RuntimeError("the cluster did not reach cluster_state:ok")

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
