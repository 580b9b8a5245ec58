"""Request and settle call ids (broker/_ids.py): unique without a system call each."""

from __future__ import annotations

import re

from broker._ids import UniqueIds


def test_ids_are_unique_within_an_owner_and_across_owners() -> None:
    one, other = UniqueIds(), UniqueIds()
    ids = [one.next() for _ in range(10_000)] + [other.next() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{24}", i) for i in ids)  # the length of the token_hex(12) they replace
    assert ids[0][:12] != ids[10_000][:12]  # 48 random bits per owner
