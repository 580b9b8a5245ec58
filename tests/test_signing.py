"""Seals and decision signatures (broker/signing.py, broker/decisions.py): what verifies and what does not.

Each case changes one thing a forger controls (a field, the path, the key, the clock) and checks that
the seal or the decision no longer verifies: tests/mutants.toml breaks each check on purpose.
"""

from __future__ import annotations

import msgspec
import pytest

from broker import SigningKey, TrustedKeys, UserQuestionError
from broker._keys import Keys
from broker.decisions import Remember, question_fingerprint, settle_extension, verified_decisions
from broker.signing import Seal, seal_outcomes
from broker.types import AskUserQuestionRequest, decode_outcome
from tests.helpers import one_question, pick, plan_review

KEY = SigningKey.generate()
TRUSTED = TrustedKeys([KEY.public_text])
NS = "team-a"
AT = 1_700_000_000_000
"""when the tests' outcomes were sealed, unix ms"""


BODY = '{"answer":{"answers":[{"id":"q1","selected":["yes"]}]}}'


def seals(n: int) -> list[Seal]:
    body = '{"answer":{"answers":[{"id":"q%d","selected":[]}]}}'
    return [Seal(f"r{i}", f"sha{i}", "builder", "client-1", "alice", body % i) for i in range(n)]


def verify(sealed: str, *, rid: str, sha: str, agent: str = "builder", client: str | None = "client-1") -> bool:
    outcome = decode_outcome(sealed)
    assert outcome.proof is not None and outcome.signed is not None
    return TRUSTED.verify_outcome(
        namespace=NS,
        request_id=rid,
        request_sha=sha,
        agent=agent,
        client=client,
        body=outcome.signed,
        proof=outcome.proof,
    )


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 33])
def test_every_outcome_of_a_batch_verifies_alone_under_one_signature(count: int) -> None:
    sealed = seal_outcomes(KEY, NS, 7, AT, seals(count))
    assert len({decode_outcome(s).proof.sig for s in sealed}) == 1  # type: ignore[union-attr]
    for i, one in enumerate(sealed):
        assert verify(one, rid=f"r{i}", sha=f"sha{i}")


@pytest.mark.parametrize(
    "change",
    [
        {"rid": "r1"},  # another request's outcome, moved onto r0
        {"sha": "sha-other"},  # the same id, another request (a different question)
        {"agent": "other-agent"},
        {"client": "client-2"},
    ],
    ids=["request-id", "request-digest", "agent", "process"],
)
def test_a_seal_is_bound_to_its_request(change: dict[str, str]) -> None:
    sealed = seal_outcomes(KEY, NS, 7, AT, seals(2))[0]
    assert verify(sealed, rid="r0", sha="sha0")
    assert not verify(sealed, **{"rid": "r0", "sha": "sha0", **change})


def test_a_seal_is_bound_to_its_namespace_body_and_signer() -> None:
    sealed = seal_outcomes(KEY, NS, 7, AT, seals(1))[0]
    outcome = decode_outcome(sealed)
    proof, body = outcome.proof, outcome.signed
    assert proof is not None and body is not None

    def verifies(namespace: str, body: str) -> bool:
        return TRUSTED.verify_outcome(
            namespace=namespace,
            body=body,
            proof=proof,
            request_id="r0",
            request_sha="sha0",
            agent="builder",
            client="client-1",
        )

    assert verifies(NS, body)  # the seal itself is good: what fails below fails for the one change
    assert not verifies("team-b", body)
    forged_body = body.replace("0", "1")
    assert not verifies(NS, forged_body)
    stranger = seal_outcomes(SigningKey.generate(), NS, 7, AT, seals(1))[0]
    assert not verify(stranger, rid="r0", sha="sha0")  # signed, but by a key nobody trusts


def test_a_keyed_ask_accepts_its_outcome_addressed_to_another_process_of_its_agent() -> None:
    sealed = seal_outcomes(KEY, NS, 7, AT, seals(1))[0]
    assert verify(sealed, rid="r0", sha="sha0", client=None)


@pytest.mark.parametrize("field", ["by", "epoch", "index", "count", "path", "at"])
def test_every_field_of_the_proof_is_covered(field: str) -> None:
    sealed = seal_outcomes(KEY, NS, 7, AT, seals(4))[1]
    wire = msgspec.json.decode(sealed)
    proof = wire["proof"]
    changed = {"by": "mallory", "epoch": 8, "index": 2, "count": 5, "path": proof["path"][:1], "at": AT + 1}
    proof[field] = changed[field]
    assert not verify(msgspec.json.encode(wire).decode(), rid="r1", sha="sha1")


def keyed(sealed: str, *, durable: str, settled_after: int | None) -> bool:
    outcome = decode_outcome(sealed)
    assert outcome.proof is not None and outcome.signed is not None
    return TRUSTED.verify_outcome(
        namespace=NS, request_id="r0", request_sha="sha0", agent="builder", client=None,
        body=outcome.signed, proof=outcome.proof, durable=durable, settled_after=settled_after,
    )  # fmt: skip


def test_a_keyed_outcome_is_bound_to_its_key_and_to_when_it_was_settled() -> None:
    """A keyed ask finds its request through a key the asking side can rewrite: a genuine answer
    sealed for another key, for no key, or long before this ask could have waited for it, is not its."""
    mine = seal_outcomes(KEY, NS, 7, AT, [Seal("r0", "sha0", "builder", "client-1", "alice", BODY, "deploy-1")])[0]
    unkeyed = seal_outcomes(KEY, NS, 7, AT, [Seal("r0", "sha0", "builder", "client-1", "alice", BODY)])[0]
    assert keyed(mine, durable="deploy-1", settled_after=AT - 1)
    assert not keyed(mine, durable="deploy-2", settled_after=AT - 1)  # another key's answer
    assert not keyed(unkeyed, durable="deploy-1", settled_after=AT - 1)  # an unkeyed ask's answer
    assert not keyed(mine, durable="deploy-1", settled_after=AT + 1)  # settled before this ask's window
    assert not verify(mine, rid="r0", sha="sha0")  # and an unkeyed ask takes no keyed answer


def test_an_unsigned_answer_has_no_proof() -> None:
    assert decode_outcome('{"answer":{"answers":[]}}').proof is None


def test_key_texts_round_trip_and_refuse_garbage() -> None:
    again = SigningKey.from_text(KEY.to_text())
    assert again.public_text == KEY.public_text and again.id == KEY.id
    assert KEY.to_text() not in repr(KEY)
    parsed = TrustedKeys.parse(f"# team-a\n{KEY.public_text}, {SigningKey.generate().public_text}\n")
    assert len(parsed) == 2 and KEY.id in parsed.ids
    for bad in ("", "qbpk1:", "qbsk1:abc", KEY.public_text):
        with pytest.raises(UserQuestionError) as raised:
            SigningKey.from_text(bad)
        assert raised.value.code == "BAD_REQUEST"
    with pytest.raises(UserQuestionError):
        TrustedKeys([KEY.to_text()])  # a secret where a public key belongs


# -- remembered decisions ------------------------------------------------------------------------------------


def decision_records(
    request: AskUserQuestionRequest,
    remember: Remember,
    *,
    now_ms: int = 1_000_000,
    key: SigningKey = KEY,
    label: str = "yes",
) -> list[str]:
    """What ask.lua returns for the decisions settle.lua stored for ``request`` answered ``label``."""
    chosen = pick(label, request.questions[0].id)
    _, args = settle_extension(Keys(NS), request, chosen, remember, signing_key=key, now_ms=now_ms, by="alice")
    decision_id, _ttl, selected, _summary, proof = args[1:6]
    return [decision_id, selected.decode(), proof.decode()]


def test_a_genuine_decision_answers_with_the_askers_own_ids() -> None:
    records = decision_records(one_question(), Remember())
    assert verified_decisions(TRUSTED, NS, one_question(), records, 1_000_001) == pick("yes")


def test_an_expired_decision_does_not_answer() -> None:
    records = decision_records(one_question(), Remember(ttl=60))
    assert verified_decisions(TRUSTED, NS, one_question(), records, 1_000_000 + 59_999) is not None
    assert verified_decisions(TRUSTED, NS, one_question(), records, 1_000_000 + 60_000) is None


def test_an_agents_decision_answers_only_that_agent() -> None:
    mine = one_question(agent="builder")
    records = decision_records(mine, Remember(scope="agent"))
    assert verified_decisions(TRUSTED, NS, mine, records, 1_000_001) is not None
    assert verified_decisions(TRUSTED, NS, one_question(agent="other"), records, 1_000_001) is None
    assert verified_decisions(TRUSTED, NS, one_question(), records, 1_000_001) is None


def test_a_decision_for_another_question_or_namespace_or_key_does_not_answer() -> None:
    records = decision_records(one_question(), Remember())
    other_question = one_question("yes", "no", "maybe")
    assert verified_decisions(TRUSTED, NS, other_question, records, 1_000_001) is None
    assert verified_decisions(TRUSTED, "team-b", one_question(), records, 1_000_001) is None
    stranger = decision_records(one_question(), Remember(), key=SigningKey.generate())
    assert verified_decisions(TRUSTED, NS, one_question(), stranger, 1_000_001) is None


def test_a_decision_never_answers_a_plan_review() -> None:
    review = plan_review()
    # Signed for the plan review's own fingerprint (a provider never stores one: check_remember refuses it).
    records = decision_records(review, Remember(), label="Approve")
    assert verified_decisions(TRUSTED, NS, review, records, 1_000_001) is None
    plain = AskUserQuestionRequest(questions=(msgspec.structs.replace(review.questions[0], intent=None),))
    records = decision_records(plain, Remember(), label="Approve")
    assert verified_decisions(TRUSTED, NS, plain, records, 1_000_001) is not None


def test_a_decision_with_a_label_the_question_lacks_or_tampered_labels_does_not_answer() -> None:
    records = decision_records(one_question(), Remember())
    assert verified_decisions(TRUSTED, NS, one_question(), [records[0], '["no"]', records[2]], 1_000_001) is None
    assert verified_decisions(TRUSTED, NS, one_question(), [records[0], '["nope"]', records[2]], 1_000_001) is None
    assert verified_decisions(TRUSTED, NS, one_question(), [records[0], "[", records[2]], 1_000_001) is None
    assert verified_decisions(TRUSTED, NS, one_question(), [], 1_000_001) is None


def test_a_broker_does_not_make_a_shared_trusted_set_trust_its_own_key() -> None:
    from broker import Broker

    shared = TrustedKeys([KEY.public_text])
    rogue = SigningKey.generate()
    broker = Broker(namespace="n", trusted_keys=shared, signing_key=rogue)
    assert rogue.id in broker.trusted_keys.ids  # a broker trusts its own signing key...
    assert rogue.id not in shared.ids  # ...without another broker given the same set trusting it


def test_a_verified_decision_signature_does_not_verify_another_message() -> None:
    """The verified-signature cache must key on what was signed, not only on the signature: else a
    genuine decision, once checked, would lend its signature to a rewritten one (another question)."""
    trusted = TrustedKeys([KEY.public_text])
    records = decision_records(one_question(), Remember())
    assert verified_decisions(trusted, NS, one_question(), records, 1_000_001) is not None  # now cached
    proof = msgspec.json.decode(records[2])
    other = one_question("go", "stop")
    proof["fingerprint"] = question_fingerprint(other.questions[0])  # the same signature, another question
    rewritten = [records[0], '["go"]', msgspec.json.encode(proof).decode()]
    assert verified_decisions(trusted, NS, other, rewritten, 1_000_001) is None
