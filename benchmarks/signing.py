"""What signed answers cost per ask, in microseconds of CPU: sealing on the provider, verifying on the asker.

python -m benchmarks.signing [--asks N]

One signature seals a whole settle.lua call (a Merkle tree over its outcomes), and an asker checks
one signature per batch root it meets, so the cost per ask falls with the batch: a busy provider
settles many asks per call, an idle one one at a time. Each row seals ``--asks`` outcomes of the
benchmark's own request (benchmarks/roles.py) in batches of that size and verifies each outcome
as a fresh asker would (one asker process per batch: the root verified once), best of several
repeats. Issue 22's budget: sealing and verifying together at most 100 us per ask. Compare with
the CPU per ask of a full run (docs/benchmarks.md), which includes both since this change.
"""

from __future__ import annotations

import argparse
import hashlib
import time

from broker import SigningKey, TrustedKeys
from broker.signing import Seal, seal_outcomes
from broker.types import AskUserQuestionAnswer, AskUserQuestionAnswerItem, Outcome, decode_outcome, encode

from .roles import REQUEST

_BATCHES = (1, 4, 16, 64, 256)


def _measure(batch: int, asks: int, repeats: int = 5) -> tuple[float, float]:
    """Best seal and verify CPU per ask (us) for ``asks`` outcomes settled ``batch`` at a time."""
    key = SigningKey.generate()
    request_sha = hashlib.sha256(encode(REQUEST)).hexdigest()
    body = encode(
        Outcome(answer=AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id="q1", selected=("yes",)),)))
    ).decode()
    seals = [Seal(f"r{i}", request_sha, "bench-root", "client-1", "alice", body) for i in range(batch)]
    rounds = max(1, asks // batch)
    best_seal = best_verify = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        sealed = [seal_outcomes(key, "bench", 7, 1_700_000_000_000, seals) for _ in range(rounds)]
        seal_s = time.process_time() - started
        started = time.process_time()
        for outcomes in sealed:
            trusted = TrustedKeys([key.public_text])  # a fresh asker: nothing verified yet
            for i, wire in enumerate(outcomes):
                outcome = decode_outcome(wire)
                assert outcome.proof is not None and outcome.signed is not None
                ok = trusted.verify_outcome(
                    namespace="bench",
                    request_id=f"r{i}",
                    request_sha=request_sha,
                    agent="bench-root",
                    client="client-1",
                    body=outcome.signed,
                    proof=outcome.proof,
                )
                assert ok
        verify_s = time.process_time() - started
        per_ask = rounds * batch
        best_seal = min(best_seal, seal_s / per_ask * 1e6)
        best_verify = min(best_verify, verify_s / per_ask * 1e6)
    return best_seal, best_verify


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.signing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--asks", type=int, default=2048, help="outcomes sealed and verified per row (default 2048)")
    args = parser.parse_args(argv)
    print("| settlements per settle call | seal us/ask (provider) | verify us/ask (asker) | total us/ask |")
    print("| ---: | ---: | ---: | ---: |")
    for batch in _BATCHES:
        seal_us, verify_us = _measure(batch, args.asks)
        print(f"| {batch} | {seal_us:.1f} | {verify_us:.1f} | {seal_us + verify_us:.1f} |")


if __name__ == "__main__":
    main()
