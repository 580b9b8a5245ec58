"""Signed answers: what an asker accepts as an answer is something no asking credential can write.

The answering side (a provider: the web page, the terminal, ``auto``) holds an Ed25519 signing
key; askers hold the public keys they trust (several, for rotation). Every outcome a provider
settles is sealed: one signature covers a whole settle call, over a Merkle tree whose leaves
bind each outcome to its namespace, request id, the SHA-256 of the exact request JSON, the
asking agent and process, who answered and the lease epoch. Each outcome carries its leaf's
path, so an asker checks it alone, and checks one signature per batch (verified roots are
remembered). A remembered decision is signed on its own, over what makes it apply (fingerprint,
selected labels, scope, agent, expiry by the Redis clock).

An error outcome (cancelled, expired, withdrawn) needs no signature: forging one only ends an
ask with an error, which a malicious asker could achieve anyway by withdrawing
(docs/security.md).

A gateway (``qbroker gateway``) attests each ask it enqueues with a key of its own, never the
answering key (a gateway must not be able to sign answers): an Ed25519 signature, under its own
domain prefix, over the namespace, request id, the request JSON's SHA-256, agent id and asking
process. Answerers pin the gateway public keys; an ask whose attestation verifies for exactly that
request shows its agent id as *verified* (the gateway's token decided it), any other as *claimed*.

Key texts: ``qbsk1:<base64url of the 32-byte seed>`` (secret) and ``qbpk1:<base64url of the
32-byte public key>``; a key's id is the first 16 hex digits of the SHA-256 of its public bytes.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
from nacl.bindings import crypto_sign, crypto_sign_BYTES, crypto_sign_open
from nacl.exceptions import BadSignatureError, CryptoError
from nacl.signing import SigningKey as _NaclSigningKey
from nacl.signing import VerifyKey

from .errors import BAD_REQUEST, UserQuestionError

__all__ = [
    "Proof",
    "Seal",
    "SigningKey",
    "TrustedKeys",
    "attestation_message",
    "decision_message",
    "public_key_text",
    "seal_outcomes",
]

_SECRET_PREFIX = "qbsk1:"
_PUBLIC_PREFIX = "qbpk1:"
_OUTCOMES_DOMAIN = b"qb-outcomes/1\x00"
_DECISION_DOMAIN = b"qb-decision/1\x00"
_CHECKPOINT_DOMAIN = b"qb-audit-checkpoint/1\x00"
_ATTEST_DOMAIN = b"qb-attest/1\x00"
_LEAF, _NODE = b"\x00", b"\x01"
_VERIFIED_ROOTS = 4096
"""verified batch roots (and decision signatures) an asker remembers before it starts afresh"""

_encoder = msgspec.json.Encoder()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _key_id(public: bytes) -> str:
    return hashlib.sha256(public).hexdigest()[:16]


def public_key_text(key: VerifyKey) -> str:
    return _PUBLIC_PREFIX + _b64(bytes(key))


class SigningKey:
    """An answering side's Ed25519 key; ``repr`` never shows the secret."""

    def __init__(self, private: _NaclSigningKey) -> None:
        self._private = private
        self.public = private.verify_key
        self._secret = bytes(private) + bytes(self.public)
        """libsodium's form of the secret key (seed, then public key): what ``crypto_sign`` takes"""
        self.public_text = public_key_text(self.public)
        self.id = _key_id(bytes(self.public))

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(_NaclSigningKey.generate())

    @classmethod
    def from_text(cls, text: str) -> SigningKey:
        text = text.strip()
        if not text.startswith(_SECRET_PREFIX):
            raise UserQuestionError(f"a signing key reads {_SECRET_PREFIX}<base64url>; got something else", BAD_REQUEST)
        try:
            seed = _unb64(text[len(_SECRET_PREFIX) :])
            return cls(_NaclSigningKey(seed))
        except (ValueError, CryptoError) as error:
            raise UserQuestionError(f"the signing key does not decode: {error}", BAD_REQUEST) from None

    def to_text(self) -> str:
        return _SECRET_PREFIX + _b64(bytes(self._private))

    def sign(self, message: bytes) -> str:
        # libsodium's Ed25519 as PyNaCl's SigningKey.sign calls it, without the SignedMessage it builds
        # around the result: every settle signs once, and at one ask at a time each us is on the ask's path.
        return _b64(crypto_sign(message, self._secret)[:crypto_sign_BYTES])

    def sign_decision(self, message: bytes) -> str:
        """The signature of a remembered decision's ``decision_message``."""
        return self.sign(_DECISION_DOMAIN + message)

    def sign_checkpoint(self, message: bytes) -> str:
        """The signature of an audit checkpoint's message (broker/audit.py ``checkpoint_message``)."""
        return self.sign(_CHECKPOINT_DOMAIN + message)

    def attest(self, *, namespace: str, request_id: str, request_sha: str, agent: str, client: str) -> str:
        """A gateway's attestation of one ask it enqueues: ``<key id>:<signature>``."""
        message = attestation_message(
            namespace=namespace, request_id=request_id, request_sha=request_sha, agent=agent, client=client
        )
        return f"{self.id}:{self.sign(_ATTEST_DOMAIN + message)}"

    def __repr__(self) -> str:
        return f"SigningKey(id={self.id!r})"


class TrustedKeys:
    """The public keys an asker accepts answers from, by key id."""

    def __init__(self, keys: Iterable[str | VerifyKey | SigningKey] = ()) -> None:
        self._keys: dict[str, VerifyKey] = {}
        for key in keys:
            self.add(key)
        self._verified: set[bytes] = set()

    @classmethod
    def parse(cls, text: str) -> TrustedKeys:
        """Public key texts separated by commas, spaces or new lines (``#`` starts a comment)."""
        words = [w for line in text.splitlines() for w in line.split("#", 1)[0].replace(",", " ").split()]
        return cls(words)

    def add(self, key: str | VerifyKey | SigningKey) -> None:
        if isinstance(key, SigningKey):
            key = key.public
        if isinstance(key, str):
            key = key.strip()
            if not key.startswith(_PUBLIC_PREFIX):
                raise UserQuestionError(
                    f"a trusted key reads {_PUBLIC_PREFIX}<base64url>; got {key[:12]!r}...", BAD_REQUEST
                )
            try:
                key = VerifyKey(_unb64(key[len(_PUBLIC_PREFIX) :]))
            except (ValueError, CryptoError) as error:
                raise UserQuestionError(f"a trusted key does not decode: {error}", BAD_REQUEST) from None
        self._keys[_key_id(bytes(key))] = key

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    @property
    def keys(self) -> tuple[VerifyKey, ...]:
        return tuple(self._keys.values())

    def _check(self, kid: str, signature: str, message: bytes) -> bool:
        key = self._keys.get(kid)
        if key is None:
            return False
        try:
            # What PyNaCl's VerifyKey.verify calls (signature, then message), without its encoder layer.
            crypto_sign_open(_unb64(signature) + message, bytes(key))
        except (BadSignatureError, CryptoError, ValueError):
            return False
        return True

    def _remember(self, token: bytes) -> None:
        if len(self._verified) >= _VERIFIED_ROOTS:
            self._verified.clear()
        self._verified.add(token)

    def verify_outcome(
        self,
        *,
        namespace: str,
        request_id: str,
        request_sha: str,
        agent: str,
        client: str | None,
        body: str,
        proof: Proof,
        durable: str = "",
        settled_after: int | None = None,
    ) -> bool:
        """True when ``proof`` seals ``body`` as the outcome of exactly this request.

        ``client`` is the asking process the outcome must be addressed to (None: any, for a keyed
        ask, whose process may have changed since the provider was shown it). ``durable`` is the
        ask's key ('' unkeyed), and ``settled_after`` (unix ms, Redis clock) the earliest a keyed
        ask's outcome may have been settled: a keyed ask names its request through a key the asking
        side can rewrite, so an old genuine answer must not pass for the answer to a new ask.
        """
        if client is not None and proof.client != client:
            return False
        if proof.durable != durable or (settled_after is not None and proof.at < settled_after):
            return False
        fields = (proof.client, proof.by, proof.epoch, proof.durable, proof.at)
        leaf = _leaf(namespace, request_id, request_sha, agent, *fields, body)
        root = _root_of(leaf, proof.index, proof.count, proof.path)
        if root is None:
            return False
        token = proof.key.encode() + root
        if token in self._verified:
            return True
        if not self._check(proof.key, proof.sig, _OUTCOMES_DOMAIN + root):
            return False
        self._remember(token)
        return True

    def verify_decision(self, message: bytes, kid: str, signature: str) -> bool:
        # Keyed on what was signed too: a signature checked once must not vouch for another message.
        token = b"d" + kid.encode() + signature.encode() + hashlib.sha256(message).digest()
        if token in self._verified:
            return True
        if not self._check(kid, signature, _DECISION_DOMAIN + message):
            return False
        self._remember(token)
        return True

    def verify_checkpoint(self, message: bytes, kid: str, signature: str) -> bool:
        return self._check(kid, signature, _CHECKPOINT_DOMAIN + message)

    def verify_attestation(
        self, attestation: str, *, namespace: str, request_id: str, request_sha: str, agent: str, client: str
    ) -> bool:
        """True when a pinned gateway key attested exactly this ask (request, agent and asking process)."""
        kid, _, signature = attestation.partition(":")
        message = attestation_message(
            namespace=namespace, request_id=request_id, request_sha=request_sha, agent=agent, client=client
        )
        return bool(agent) and self._check(kid, signature, _ATTEST_DOMAIN + message)

    def __repr__(self) -> str:
        return f"TrustedKeys(ids={list(self._keys)!r})"


class Proof(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What makes an outcome an answer: the batch signature and this outcome's path to its root."""

    key: str
    """the signing key's id"""
    sig: str
    """Ed25519 signature (base64url) of the batch root"""
    by: str
    epoch: int
    client: str
    """the asking process the outcome was addressed to"""
    durable: str = ""
    """the keyed ask's key ('' for an unkeyed ask)"""
    at: int = 0
    """when it was sealed, unix ms by the Redis clock (as the provider keeps it)"""
    index: int
    count: int
    """this leaf's position among ``count`` leaves"""
    path: tuple[str, ...] = ()
    """sibling hashes (base64url) from the leaf up to the root"""


@dataclass(frozen=True)
class Seal:
    """One outcome to seal, with everything its leaf binds."""

    request_id: str
    request_sha: str
    agent: str
    client: str
    by: str
    body: str
    durable: str = ""
    """the request's key, if it was asked with one"""


def _leaf(*fields: str | int) -> bytes:
    """namespace, request id, request SHA-256, agent, client, by, epoch, key, sealed at (ms), outcome JSON."""
    return hashlib.sha256(_LEAF + _encoder.encode(["qb-outcome/2", *fields])).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_NODE + left + right).digest()


@functools.lru_cache(maxsize=4096)
def _path_node(text: str) -> bytes:
    """A Merkle path's node, decoded. The outcomes of one sealed batch share their path's upper nodes, so an asker
    verifying many of them decodes each once (base64 was a tenth of its CPU per ask: docs/benchmarks-budget.md)."""
    return _unb64(text)


def _root_of(leaf: bytes, index: int, count: int, path: tuple[str, ...]) -> bytes | None:
    """The root that ``path`` leads to from ``leaf``, or None when the path does not fit the position."""
    if not 0 <= index < count or count > 1 << 20:
        return None
    node, size, step = leaf, count, 0
    try:
        while size > 1:
            if index % 2 == 1:
                node = _node(_path_node(path[step]), node)
                step += 1
            elif index + 1 < size:
                node = _node(node, _path_node(path[step]))
                step += 1
            index, size = index // 2, (size + 1) // 2
    except (IndexError, ValueError):
        return None
    return node if step == len(path) else None


def seal_outcomes(key: SigningKey, namespace: str, epoch: int, at: int, seals: list[Seal]) -> list[str]:
    """Each outcome's wire form ``{"signed": body, "proof": ...}``; one signature for the batch.

    ``at``: now, unix ms by the Redis clock.
    """
    leaves = [
        _leaf(namespace, s.request_id, s.request_sha, s.agent, s.client, s.by, epoch, s.durable, at, s.body)
        for s in seals
    ]
    levels = [leaves]
    while len(levels[-1]) > 1:
        below = levels[-1]
        levels.append(
            [_node(below[i], below[i + 1]) if i + 1 < len(below) else below[i] for i in range(0, len(below), 2)]
        )
    signature = key.sign(_OUTCOMES_DOMAIN + levels[-1][0])
    # Each node's text once: every node is a sibling on the path of each leaf under its neighbour.
    texts = [[_b64(node) for node in level] for level in levels[:-1]]
    sealed: list[str] = []
    for index, seal in enumerate(seals):
        path: list[str] = []
        position = index
        for level in texts:
            sibling = position ^ 1
            if sibling < len(level):
                path.append(level[sibling])
            position //= 2
        proof = Proof(
            key=key.id,
            sig=signature,
            by=seal.by,
            epoch=epoch,
            client=seal.client,
            durable=seal.durable,
            at=at,
            index=index,
            count=len(seals),
            path=tuple(path),
        )
        sealed.append(_encoder.encode({"signed": seal.body, "proof": proof}).decode())
    return sealed


def decision_message(
    *,
    namespace: str,
    decision_id: str,
    scope: str,
    agent: str,
    fingerprint: str,
    selected: Iterable[str],
    expires_ms: int,
    by: str,
) -> bytes:
    """The bytes a remembered decision's signature covers."""
    fields: list[Any] = ["qb-decision/1", namespace, decision_id, scope, agent, fingerprint, list(selected)]
    return _encoder.encode([*fields, expires_ms, by])


def attestation_message(*, namespace: str, request_id: str, request_sha: str, agent: str, client: str) -> bytes:
    """The bytes a gateway's attestation of one ask covers."""
    return _encoder.encode(["qb-attest/1", namespace, request_id, request_sha, agent, client])
