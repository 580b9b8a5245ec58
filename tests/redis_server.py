"""The tests' private redis-server (the one the demo and the benchmarks use too)."""

from workers.redis_server import REDIS_SERVER, RedisServer, free_port

__all__ = ["FAST_SYNC", "REDIS_SERVER", "RedisServer", "free_port"]

FAST_SYNC = ("--repl-diskless-sync-delay", "0")
"""A master's options for a replica's full sync to start at once: Redis 7.0 waits 5 s for more replicas
to share a diskless sync. A master's setting (on the replica it does nothing until it is promoted); a test
whose fault needs that delay (tests/test_client_faults.py re-promotes a server before it syncs) leaves it out."""
