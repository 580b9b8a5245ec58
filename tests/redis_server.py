"""The tests' private redis-server (the one the demo and the benchmarks use too)."""

from workers.redis_server import REDIS_SERVER, RedisServer, free_port

__all__ = ["REDIS_SERVER", "RedisServer", "free_port"]
