"""A Sentinel-managed Redis on loopback for the tests: a master, a replica, and sentinels."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from redis import Redis as SyncRedis

from tests.redis_server import REDIS_SERVER, RedisServer, free_port

REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
SERVICE = "qb"


class SentinelProcess(RedisServer):
    """``redis-server <conf> --sentinel``: it rewrites its config file, so it gets its own."""

    def __init__(self, directory: Path, master_port: int, *, quorum: int, down_after_ms: int) -> None:
        super().__init__(directory)
        self.config = directory / "sentinel.conf"
        self.config.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    "bind 127.0.0.1",
                    f"dir {directory}",
                    f"logfile {directory / 'sentinel.log'}",
                    f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} {quorum}",
                    f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}",
                    f"sentinel failover-timeout {SERVICE} 4000",
                    f"sentinel parallel-syncs {SERVICE} 1",
                    "",
                ]
            )
        )

    def start(self) -> SentinelProcess:
        self.process = subprocess.Popen(
            [REDIS_SERVER, str(self.config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait_ready()
        return self


class SentinelGroup:
    """One master, one replica, ``sentinels`` sentinels watching them as service ``qb``."""

    def __init__(self, directory: Path, *, sentinels: int = 1, down_after_ms: int = 1000) -> None:
        fast_sync = ("--repl-diskless-sync-delay", "0")  # 7.0 waits 5 s for more replicas by default
        self.master = RedisServer(directory / "master", *fast_sync)
        self.replica = RedisServer(
            directory / "replica", *fast_sync, "--replicaof", "127.0.0.1", str(self.master.port), port=free_port()
        )
        quorum = sentinels // 2 + 1
        self.sentinels = [
            SentinelProcess(directory / f"sentinel{i}", self.master.port, quorum=quorum, down_after_ms=down_after_ms)
            for i in range(sentinels)
        ]

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{SERVICE}"

    def cli(self, port: int, *args: str) -> str:
        done = subprocess.run(
            [REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), *args], capture_output=True, text=True, timeout=30
        )
        return done.stdout.strip()

    def start(self) -> SentinelGroup:
        try:
            self.master.start()
            self.replica.start()
            self.wait_for(lambda: "master_link_status:up" in self.cli(self.replica.port, "INFO", "replication"))
            for sentinel in self.sentinels:
                sentinel.start()
            # the sentinels know the replica (learnt from the master's INFO) before any failover
            self.wait_for(
                lambda: all(
                    str(self.replica.port) in self.cli(s.port, "SENTINEL", "REPLICAS", SERVICE) for s in self.sentinels
                )
            )
        except BaseException:
            self.kill()
            raise
        return self

    def master_port(self, sentinel: int = 0) -> int:
        """The master's port as a sentinel (the first by default) sees it."""
        reply = self.cli(self.sentinels[sentinel].port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE).split()
        return int(reply[1])

    def failover(self, *, kill_clients: bool = True) -> int:
        """Promote the replica (SENTINEL FAILOVER) and wait until it serves writes; returns its port.

        ``kill_clients=False`` demotes the old master with a bare REPLICAOF (an operator's
        switchover): its blocked clients then get ``-UNBLOCKED`` replies, not a closed socket.
        """
        old = self.master_port()
        deadline = time.monotonic() + 20
        while "OK" not in self.cli(self.sentinels[0].port, "SENTINEL", "FAILOVER", SERVICE):
            if time.monotonic() > deadline:
                raise RuntimeError("SENTINEL FAILOVER was refused until the deadline")
            time.sleep(0.2)  # NOGOODSLAVE until the sentinel has fresh INFO from the replica
        self.wait_for(lambda: self.master_port() != old)
        new = self.master_port()
        self.wait_for(lambda: "role:master" in self.cli(new, "INFO", "replication"))
        # The other sentinels learn the new configuration from hello messages (about 2 s);
        # until then a client asking one of them is sent to the old master.
        self.wait_for(lambda: all(self.master_port(i) == new for i in range(len(self.sentinels))))
        if self.cli(old, "PING") == "PONG":
            if kill_clients:
                self.demote(old, new)
            else:
                self.cli(old, "REPLICAOF", "127.0.0.1", str(new))
        return new

    def demote(self, old: int, new: int) -> None:
        """What a sentinel does to a master it failed over, about 8 s after the promotion.

        Until then the old master still takes writes (and loses them when it resyncs); doing
        it now keeps the tests fast and deterministic. Same commands, same transaction:
        MULTI, REPLICAOF, CLIENT KILL TYPE normal, CLIENT KILL TYPE pubsub, EXEC.
        """
        with SyncRedis(host="127.0.0.1", port=old) as client, client.pipeline(transaction=True) as tx:
            tx.execute_command("REPLICAOF", "127.0.0.1", new)
            tx.execute_command("CLIENT", "KILL", "TYPE", "normal")
            tx.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            tx.execute()

    def wait_for(self, condition: object, timeout: float = 20) -> None:
        assert callable(condition)
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError("sentinel group: condition not reached in time")
            time.sleep(0.05)

    def kill(self) -> None:
        for server in (*self.sentinels, self.replica, self.master):
            if server.process is not None:
                server.resume()
            server.kill()
