"""Password hashes (scrypt) as the users file keeps them: written by ``qbroker web --hash-password`` and
``qbroker quickstart``, checked by the page at sign-in.

A piece both sides share: quickstart (operating) writes the users file that the page (answering)
reads, and neither imports the other for it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["hash_password", "unmatchable_hash", "verify_password"]

_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**14, 8, 1


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    salt = salt or secrets.token_bytes(16)
    key = hashlib.scrypt(password.encode(), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P)
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${salt.hex()}${key.hex()}"


def unmatchable_hash() -> str:
    """A stored hash at the default cost that no password matches (its key is 64 zero bytes, which scrypt
    gives with a chance of 2^-512): checking a password against it costs the one scrypt a real hash does,
    and making it costs none (it was a scrypt of its own at every web process start)."""
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${'00' * 16}${'00' * 64}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, key = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = bytes.fromhex(key)
        derived = hashlib.scrypt(
            password.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p), dklen=len(expected)
        )
    except ValueError:
        return False
    return hmac.compare_digest(derived, expected)
