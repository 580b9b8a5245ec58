"""What the adapters' restart scripts share: the broker of an asking process a test starts."""

from __future__ import annotations

import os

from broker import Broker


def asker_from_env() -> Broker:
    """A broker on the Redis and namespace the test gave the process, trusting the tests' answering key
    (``tests.workers.procs.env_for``)."""
    return Broker(
        os.environ["QBROKER_REDIS_URL"],
        namespace=os.environ["QBROKER_NAMESPACE"],
        trusted_keys=os.environ["QBROKER_TRUSTED_KEYS"],
    )
