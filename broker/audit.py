"""A tamper-evident audit: every entry chained to the one before it, sealed by signed checkpoints.

Every audit entry is appended by one Lua helper (``scripts/_audit.lua``), inside the script that
makes the change it records: the entry starts with ``prev``, the chain head before it
(``<entry id> <chain>``), and ends with ``chain``, the SHA-1 of all its fields. The head is kept in
``qb:{NS}:audit:head``. So an entry deleted, altered or slipped in between shows as a broken link;
and the answering side, which holds the signing key, appends now and then a ``checkpoint`` entry
signing (namespace, entry id, chain) of the head it follows: rewriting history under a checkpoint
(recomputing every chain after the change) needs the signing key, or a SHA-1 second preimage.

``verify`` walks the stream and says what it found (docs/security.md, docs/cli.md
``qbroker audit verify``). Trimming the stream's start (its cap) is normal: the first entry
left names a predecessor that is gone, reported as the start, not as a deletion.

A checkpoint also names the one its process wrote before (``after``; the broker keeps it across its providers):
when Redis restarts without its data, the audit starts afresh, and the first checkpoint a surviving provider
writes names one the audit never held since; ``verify`` then reports the history before the new start as
``lost``, instead of taking it for the beginning of the chain.

A person's decision (``HUMAN_EVENTS``) is also copied, same id and fields, into the human record
``qb:{NS}:audit:human``, capped like the audit, which no other entry enters: however many entries
askers cause (each ask of a gone process is a ``withdrawn`` entry), they trim the audit and never
the record. Its entries carry ``hprev``, the record's head before them, so they chain on their
own, and what a checkpoint seals binds them back through it; and ``hcap``, the cap they were
written under (only those appends trim the record, which leaves at least that many). ``verify``
checks the record's chain, that every decision in the audit is in the record and every record
entry in the audit's span is in the audit, alike, and that a trimmed record holds its cap; a
decision missing from either is reported, not taken for the cap.

An ``answered`` or ``cancelled`` entry also says what was asked (``asked``, written by ``asked_of``: the asker's
agent and each question's id, its text cut to ``ASKED_CHARS``, a plan's approve label), so whatever process
answered, and however long ago, a history reads the question, its asker and the verdict from the record itself.
``newest`` reads the latest entries of the audit and the human record together.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from . import _scripts as scripts
from ._commands import Commands
from ._keys import Keys
from .signing import SigningKey, TrustedKeys
from .types import AskUserQuestionRequest, PlanReviewIntent

__all__ = [
    "ASKED_CHARS",
    "CHECKPOINT_EVERY",
    "HUMAN_EVENTS",
    "AuditReport",
    "Finding",
    "asked_of",
    "chain_of",
    "checkpoint",
    "checkpoint_message",
    "newest",
    "verify",
]

log = logging.getLogger(__name__)

CHECKPOINT_EVERY: Final = 10.0
"""seconds between a provider's checkpoints while the audit moves (and one more as it stops)"""
_PAGE: Final = 1000
HUMAN_EVENTS: Final = frozenset({"answered", "cancelled", "vote", "remembered", "forgotten"})
"""the events that are a person's decision, kept in the human record too (scripts/_audit.lua lists the same)"""

ASKED_CHARS: Final = 300
"""characters of each question's text an ``asked`` field keeps: enough to tell the question, small per answer"""

FindingKind = Literal["deleted", "altered", "inserted", "restarted", "unchained", "checkpoint", "lost"]


def chain_of(pairs: list[tuple[str, str]]) -> str:
    """The chain value of an entry whose fields (``prev`` first, ``chain`` left out) are ``pairs``."""
    digest = hashlib.sha1(usedforsecurity=False)
    for name, value in pairs:
        for text in (name, value):
            data = text.encode()
            digest.update(b"%d:%s" % (len(data), data))
    return digest.hexdigest()


def asked_of(request: AskUserQuestionRequest) -> str:
    """An answer's ``asked`` field: what its request asked, as a history shows it (JSON, a few hundred bytes).

    The agent as the request names it (the entry's ``asker`` says whether a gateway verified it), each question's
    id and text (cut to ``ASKED_CHARS``), a plan review's approve label (what tells approved from declined).
    Nothing else of the request: no details, options or arguments, and never a credential (a request holds none).
    """
    questions: list[dict[str, str]] = []
    for item in request.questions:
        text = item.question if len(item.question) <= ASKED_CHARS else item.question[: ASKED_CHARS - 1] + "…"
        question = {"id": item.id, "question": text}
        if isinstance(item.intent, PlanReviewIntent):
            question["approve"] = item.intent.approve
        questions.append(question)
    summary: dict[str, object] = {"questions": questions}
    if request.agent:
        summary["agent"] = request.agent
    # msgspec writes the same compact UTF-8 JSON as json.dumps(ensure_ascii=False, separators=(",", ":")) in a
    # tenth of the time, once per answered ask on the provider (docs/benchmarks-budget.md)
    return msgspec.json.encode(summary).decode()


async def newest(
    commands: Commands, keys: Keys, count: int, *, before: str | None = None
) -> list[tuple[str, dict[str, str]]]:
    """The newest ``count`` entries of the audit and its human record together (each once), newest first; with
    ``before`` (an entry id), those older than it: the next page of a reader that has read down to it.

    The record keeps people's decisions the audit's cap trimmed (askers' volume), so a history still finds them.
    It copies the audit's entries under the same ids, so one ``before`` pages both.
    """
    end = f"({before}" if before else "+"
    audit = await commands.call("XREVRANGE", keys.audit, end, "-", "COUNT", count)
    human = await commands.call("XREVRANGE", keys.audit_human, end, "-", "COUNT", count)
    merged = {entry_id: _parse(entry_id, flat).fields for entry_id, flat in [*audit, *human]}
    return sorted(merged.items(), key=lambda item: _id_key(item[0]), reverse=True)[:count]


def checkpoint_message(namespace: str, entry_id: str, chain: str) -> bytes:
    """What a checkpoint signs: this namespace's audit, up to and including ``entry_id``, hashes to ``chain``."""
    return f"{namespace}\0{entry_id}\0{chain}".encode()


async def checkpoint(
    commands: Commands,
    keys: Keys,
    key: SigningKey,
    *,
    provider: str,
    epoch: int,
    maxlen: int,
    unless_at: str | None = None,
    after: str | None = None,
) -> str | None:
    """Seal the audit as it stands: append a checkpoint signing its head; the checkpoint's entry id.

    Nothing is written (None) when the audit is unchained (fakeredis), when its head is still
    ``unless_at`` (the checkpoint this provider wrote last: nothing new to seal), or when it is empty and
    there is no ``after``. ``after``: the checkpoint this process wrote last, named in this one: should the
    audit have lost it (Redis restarted without its data), ``verify`` tells the history before is gone; an
    empty audit then gets a checkpoint of nothing (``at`` and ``sealed`` empty) that names it.
    """
    for _ in range(5):
        head = await commands.call("GET", keys.audit_head) or ""
        entry_id, _, chain = head.partition(" ")
        if not head and after:
            pass  # empty, though this process sealed it before: a checkpoint of nothing names what it sealed
        elif not chain or entry_id == unless_at:
            return None
        signature = key.sign_checkpoint(checkpoint_message(keys.namespace, entry_id, chain))
        fields = ["event", "checkpoint", "at", entry_id, "sealed", chain, "key", key.id, "sig", signature]
        if after:
            fields += ["after", after]
        fields += ("provider", provider, "epoch", epoch)
        reply = await scripts.audit_append(commands, audit=keys.audit, audit_max=maxlen, head=head, fields=fields)
        if reply.kind == "ok":
            return reply.value
        # Another entry came first: sign the new head, so a checkpoint always seals all before it.
    log.info("audit checkpoint of %s skipped: the audit kept moving", keys.namespace)
    return None


@dataclass(frozen=True)
class Finding:
    """One sign of tampering: ``entry`` is the id of the entry concerned (gone, for ``deleted``)."""

    kind: FindingKind
    entry: str
    detail: str


@dataclass
class AuditReport:
    """What ``verify`` found in one namespace's audit."""

    namespace: str
    entries: int = 0
    first: str | None = None
    """the first entry left"""
    trimmed: bool = False
    """the first entry names a predecessor that is gone: earlier entries were trimmed (the cap)"""
    last: str | None = None
    legacy: int = 0
    """entries before the chain began (no ``chain`` field: written by an older version, or under fakeredis)"""
    checkpoints: int = 0
    """checkpoints signed by a trusted key that match the chain"""
    sealed_through: str | None = None
    """the latest entry a trusted checkpoint seals (it and everything before it)"""
    unsealed: int = 0
    """entries after ``sealed_through`` (checkpoints aside): chained, not yet signed"""
    human_entries: int = 0
    """entries in the human record (a copy of every decision the audit recorded, capped alike)"""
    human_first: str | None = None
    human_kept: int = 0
    """decisions the record keeps from before the audit's first entry (its cap trimmed them from the audit)"""
    findings: list[Finding] = field(default_factory=list)

    @property
    def status(self) -> Literal["intact", "broken", "unchained"]:
        if self.findings:
            return "broken"
        if self.entries and self.legacy == self.entries:
            return "unchained"
        return "intact"

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "status": self.status,
            "entries": self.entries,
            "first": self.first,
            "trimmed": self.trimmed,
            "last": self.last,
            "unchained": self.legacy,
            "checkpoints": self.checkpoints,
            "sealedThrough": self.sealed_through,
            "unsealed": self.unsealed,
            "humanEntries": self.human_entries,
            "humanFirst": self.human_first,
            "humanKept": self.human_kept,
            "findings": [{"kind": f.kind, "entry": f.entry, "detail": f.detail} for f in self.findings],
        }


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return (-1, -1)


@dataclass
class _Entry:
    id: str
    pairs: list[tuple[str, str]]
    chain: str
    prev_id: str
    prev_chain: str

    @property
    def fields(self) -> dict[str, str]:
        return dict(self.pairs)


def _parse(entry_id: str, flat: Any) -> _Entry:
    items = list(flat.items()) if isinstance(flat, dict) else list(zip(flat[::2], flat[1::2], strict=True))
    pairs = [(str(k), str(v)) for k, v in items]
    chain, prev = "", ""
    if len(pairs) >= 2 and pairs[0][0] == "prev" and pairs[-1][0] == "chain":
        chain, prev = pairs[-1][1], pairs[0][1]
    prev_id, _, prev_chain = prev.partition(" ")
    return _Entry(entry_id, pairs, chain, prev_id, prev_chain)


async def _read_all(commands: Commands, stream: str) -> list[_Entry]:
    entries: list[_Entry] = []
    start = "-"
    while True:
        page = await commands.call("XRANGE", stream, start, "+", "COUNT", _PAGE)
        entries += [_parse(entry_id, flat) for entry_id, flat in page]
        if len(page) < _PAGE:
            return entries
        start = "(" + page[-1][0]


async def verify(commands: Commands, keys: Keys, trusted: TrustedKeys) -> AuditReport:
    """Walk the audit stream and its human record: recompute their chains, check the checkpoints against ``trusted``."""
    # Both heads at once (one slot), before the entries: later ones must chain from them, and every record entry
    # up to its head was in the audit too by then. The record after the audit: it holds every decision read there.
    head, human_head = await commands.call("MGET", keys.audit_head, keys.audit_human_head)
    entries = await _read_all(commands, keys.audit)
    human = await _read_all(commands, keys.audit_human)
    return judge(keys.namespace, entries, head, trusted, human=human, human_head=human_head)


def judge(
    namespace: str,
    entries: list[_Entry],
    head: str | None,
    trusted: TrustedKeys,
    *,
    human: list[_Entry] | None = None,
    human_head: str | None = None,
) -> AuditReport:
    report = AuditReport(namespace, entries=len(entries))
    human = human or []
    report.human_entries = len(human)
    report.human_first = human[0].id if human else None
    if not entries:
        if head:
            report.findings.append(Finding("deleted", head.partition(" ")[0], "the audit is empty, its head names it"))
        return report
    report.first, report.last = entries[0].id, entries[-1].id
    # Entries written before the chain began (an older version, fakeredis) come first, if at all.
    start = 0
    while start < len(entries) and not entries[start].chain:
        start += 1
    report.legacy = start
    chain = entries[start:]
    if not chain:
        return report
    found = report.findings
    reported: set[tuple[str, str]] = set()

    def find(kind: FindingKind, entry: str, detail: str) -> None:
        if (kind, entry) not in reported:
            reported.add((kind, entry))
            found.append(Finding(kind, entry, detail))

    if start and chain[0].prev_id:
        find("altered", entries[start - 1].id, "not chained, though the chain's first entry names it")
    at = {entry.id: i for i, entry in enumerate(chain)}
    for entry in chain:
        if not entry.chain:
            find("unchained", entry.id, "no chain: written past the audit's chain")
        elif chain_of(entry.pairs[:-1]) != entry.chain:
            find("altered", entry.id, "its fields do not hash to its chain")

    on_chain, trimmed = _links(chain, head, find)
    if trimmed and not start:
        report.trimmed = True

    sealed = -1
    for i, entry in enumerate(chain):
        fields = entry.fields
        if fields.get("event") != "checkpoint":
            continue
        target, sealed_chain = fields.get("at", ""), fields.get("sealed", "")
        message = checkpoint_message(namespace, target, sealed_chain)
        if not trusted.verify_checkpoint(message, fields.get("key", ""), fields.get("sig", "")):
            find("checkpoint", entry.id, f"not signed by a trusted key (key {fields.get('key', '')!r})")
            continue
        _judge_after(entry, chain, at, find)
        if target in at:
            j = at[target]
            if chain[j].chain != sealed_chain or j not in on_chain or j >= i:
                find("checkpoint", entry.id, f"seals {target} as another chain than the one it holds now")
            elif not any(f.entry == chain[j].id for f in found):
                report.checkpoints += 1
                sealed = max(sealed, j)
        elif _id_key(target) >= _id_key(chain[0].id):
            find("deleted", target, f"checkpoint {entry.id} seals it, and it is gone")
    if sealed >= 0:
        report.sealed_through = chain[sealed].id
    report.unsealed = sum(1 for e in chain[sealed + 1 :] if e.fields.get("event") != "checkpoint")
    _judge_human(report, chain, human, human_head, find)
    return report


def _judge_after(
    entry: _Entry, chain: list[_Entry], at: dict[str, int], find: Callable[[FindingKind, str, str], None]
) -> None:
    """A trusted checkpoint names the one its process wrote before (``after``). One older than the chain's
    first entry, where the chain begins (that entry follows none: no cap trimmed what came before), was in an
    audit that is gone: Redis restarted without its data, or someone deleted the audit and its head."""
    after = entry.fields.get("after", "")
    if after and after not in at and not chain[0].prev_id and _id_key(after) < _id_key(chain[0].id):
        find(
            "lost",
            chain[0].id,
            f"the history before it is gone: checkpoint {entry.id} follows {after}, which the audit no longer holds"
            " (Redis restarted without its data, or the audit was deleted)",
        )


def _judge_human(
    report: AuditReport,
    chain: list[_Entry],
    human: list[_Entry],
    human_head: str | None,
    find: Callable[[FindingKind, str, str], None],
) -> None:
    """The human record: chained on its own (``hprev``), and holding what the audit holds of people's decisions.

    A decision the audit still holds must be in the record, unless the record's cap trimmed it (it is older than
    the record's first entry); a record entry within the audit's span must be in the audit; either, as the other
    holds it; a record whose start was trimmed holds at least its cap (else its first decisions were deleted).
    Record entries older than the audit's first entry are the ones it keeps (``human_kept``).
    """

    def in_record(kind: FindingKind, entry: str, detail: str) -> None:
        find(kind, entry, detail + " (the human record)")

    record = [_Entry(e.id, e.pairs, e.chain, *_split(e.fields.get("hprev", ""))) for e in human]
    if record:
        for entry in record:
            if chain_of(entry.pairs[:-1]) != entry.chain:
                in_record("altered", entry.id, "its fields do not hash to its chain")
        _, trimmed = _links(record, human_head, in_record)
        # Only a decision's own XADD trims the record (MAXLEN ~ its hcap), and that leaves at least hcap entries.
        cap = min((int(e.fields["hcap"]) for e in record if e.fields.get("hcap", "").isdigit()), default=0)
        if trimmed and len(record) < cap:
            in_record("deleted", record[0].prev_id, f"{record[0].id} follows it, and {len(record)} < its cap {cap}")
    elif human_head:
        in_record("deleted", human_head.partition(" ")[0], "the record is empty, its head names it")
    kept = {entry.id: entry for entry in record}
    first = _id_key(record[0].id) if record else (-1, -1)
    for entry in chain:
        fields = entry.fields
        if fields.get("event") not in HUMAN_EVENTS or "hprev" not in fields or _id_key(entry.id) < first:
            continue  # not a decision; written before the record began; or trimmed from the record by its cap
        copy = kept.get(entry.id)
        if copy is None:
            find("deleted", entry.id, "a person's decision, missing from the human record")
        elif copy.chain != entry.chain:
            find("altered", entry.id, "the human record holds another version of it")
    # Up to the record's head (read with the audit's), each record entry was in the audit: one gone from there
    # (the audit's last entries deleted, and its head moved back) is named.
    audit = {entry.id: entry for entry in chain}
    start, end = _id_key(chain[0].id), _id_key((human_head or "").partition(" ")[0])
    for entry in record:
        if _id_key(entry.id) < start:
            report.human_kept += 1
        elif _id_key(entry.id) <= end and entry.id not in audit:
            find("deleted", entry.id, "a person's decision in the human record, gone from the audit")


def _split(link: str) -> tuple[str, str]:
    entry_id, _, chain = link.partition(" ")
    return entry_id, chain


def _links(
    chain: list[_Entry], head: str | None, find: Callable[[FindingKind, str, str], None]
) -> tuple[set[int], bool]:
    """Follow the links back from ``head``: the indexes of the entries on them, and whether they run past the
    first entry (its start trimmed); each break is a finding."""
    at = {entry.id: i for i, entry in enumerate(chain)}
    # The chain runs back from its head: the last entry appended by the scripts.
    head_id, _, head_chain = (head or "").partition(" ")
    if not head_id:
        find("deleted", chain[-1].id, "the chain head key is gone")
        tail = len(chain) - 1
    elif head_id in at:
        tail = at[head_id]
        if chain[tail].chain != head_chain:
            find("altered", head_id, "the chain head names another version of it")
    else:
        find("deleted", head_id, "the chain head names it, and it is gone")
        tail = max((i for i, e in enumerate(chain) if _id_key(e.id) < _id_key(head_id)), default=-1)
    # Entries appended after the head was read must chain on from it.
    for i in range(tail + 1, len(chain)):
        entry, before = chain[i], chain[i - 1] if i else None
        if before is None or (entry.prev_id, entry.prev_chain) != (before.id, before.chain):
            find("inserted", entry.id, "after the chain head, and not chained to the entry before it")

    on_chain: set[int] = set()
    trimmed = False
    i = tail
    while i >= 0:
        on_chain.add(i)
        entry = chain[i]
        if not entry.prev_id:
            if i > 0:
                find("restarted", entry.id, "the chain starts afresh here: its head was deleted or reset")
            j = i - 1
        elif entry.prev_id in at and at[entry.prev_id] < i:
            j = at[entry.prev_id]
            if chain[j].chain != entry.prev_chain:
                find("altered", chain[j].id, f"rewritten: {entry.id} follows another version of it")
        elif _id_key(entry.prev_id) < _id_key(chain[0].id):
            trimmed = True
            j = -1
        elif entry.prev_id in at:
            find("altered", entry.id, f"names a later entry, {entry.prev_id}, as the one before it")
            j = i - 1
        else:
            find("deleted", entry.prev_id, f"{entry.id} follows it, and it is gone")
            j = max((k for k in range(i) if _id_key(chain[k].id) < _id_key(entry.prev_id)), default=-1)
        for k in range(j + 1, i):
            find("inserted", chain[k].id, "not in the chain: no entry after it follows it")
        i = j
    return on_chain, trimmed
