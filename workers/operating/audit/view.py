"""The engine of ``qbroker audit verify``."""

from __future__ import annotations

import argparse
import json
import sys

import msgspec
from redis.exceptions import RedisError

from broker import Reads, UserQuestionError
from broker.audit import AuditReport
from broker.errors import BROKER_UNAVAILABLE, NO_TRUSTED_KEY
from workers.exits import EXIT_AUDIT_TAMPERED as EXIT_TAMPERED
from workers.exits import EXIT_AUDIT_UNCHAINED as EXIT_UNCHAINED
from workers.exits import EXIT_STATUS
from workers.settings import Settings

__all__ = ["format_report", "run"]


def format_report(report: AuditReport) -> str:
    """The human form: a verdict line, then what it rests on, then each finding."""
    if not report.entries:
        head = f"audit of {report.namespace}: empty"
        return head if report.status == "intact" else head + "\nTAMPERED:\n" + _findings(report)
    status = report.status.upper()
    lines = [f"audit of {report.namespace}: {status}, {report.entries} entries, {report.first} .. {report.last}"]
    if report.trimmed:
        lines.append(f"starts at {report.first} (earlier entries trimmed)")
    elif any(finding.kind == "lost" for finding in report.findings):
        lines.append(f"starts at {report.first} (the history before it is gone: see the finding below)")
    else:
        lines.append(f"starts at {report.first} (the beginning of the chain)")
    if report.legacy:
        lines.append(f"{report.legacy} entries not chained (written before the audit was chained, or by fakeredis)")
    if report.sealed_through:
        lines.append(f"sealed through {report.sealed_through} by {report.checkpoints} trusted checkpoint(s)")
    else:
        lines.append("no trusted checkpoint seals any of it")
    if report.unsealed:
        lines.append(f"{report.unsealed} entries after it not yet sealed (chained, not signed yet)")
    if report.human_entries:
        lines.append(
            f"{report.human_entries} decision(s) of people in the human record, from {report.human_first}"
            f" ({report.human_kept} from before the audit's first entry)"
        )
    if report.findings:
        lines.append(f"TAMPERED: {len(report.findings)} finding(s)")
        lines.append(_findings(report))
    return "\n".join(lines)


def _findings(report: AuditReport) -> str:
    return "\n".join(f"  {f.kind:<10} {f.entry}  {f.detail}" for f in report.findings)


def _fail(error: UserQuestionError) -> int:
    print(msgspec.json.encode(error.to_payload()).decode(), file=sys.stderr)
    return EXIT_STATUS.get(error.code, 1)


async def run(args: argparse.Namespace) -> int:
    settings: Settings = args.settings
    try:
        async with settings.broker() as broker:
            if not broker.trusted_keys:
                raise UserQuestionError(
                    "checkpoints are checked against the answering side's public keys: pass --trusted-keys-file",
                    NO_TRUSTED_KEY,
                )
            report = await Reads(broker).verify_audit()
    except UserQuestionError as error:
        return _fail(error)
    except (OSError, RedisError) as error:
        return _fail(UserQuestionError(f"Redis is unavailable: {error}", BROKER_UNAVAILABLE))
    print(json.dumps(report.to_json()) if args.json else format_report(report))
    return {"intact": 0, "broken": EXIT_TAMPERED, "unchained": EXIT_UNCHAINED}[report.status]
