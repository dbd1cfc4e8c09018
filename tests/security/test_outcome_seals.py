"""A user believes only its own GM's word on its tasks (issue 32 item 7): outcomes are
sealed by the user's GM under the key of that pair; the submitter drops the rest."""

from __future__ import annotations

from common import codec
from common.config import FederationConfig
from common.ids import GmId, JobId, TaskId, UserId
from common.messages import JobRefusal, TaskOutcome, TaskOutcomes
from common.model import Task, TaskSpec
from request_generator.submitter import Submitter
from security import sealing
from security.access import Access, parties
from security.identity import OPERATOR, gm, lm, user
from security.outcomes import STREAM, OutcomeSealer, outcome_key
from security.party_keys import PartyKeys
from security.secret import Secret

CFG = FederationConfig().validate()  # u0 of gm0, u1 of gm1, u2 of gm2
SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
SPEC = TaskSpec(
    task_id=TaskId("t1"), job_id=JobId("j1"), user=UserId("u0"), demand=(1,), duration=1.0
)


def body(of: str = "gm0") -> bytes:
    return codec.encode(
        TaskOutcomes(gm=GmId(of), outcomes=(TaskOutcome(task=Task(spec=SPEC), finished=True),))
    )


def submitter() -> Submitter:
    return Submitter(CFG, Access(OPERATOR, CFG, SECRET), {})


def take(sub: Submitter, headers: dict[str, object] | None, data: bytes) -> None:
    sub.take_outcomes("gm0", sub.access.outcome_key("gm0", "u0"), headers, data)


def gm_keys(name: str) -> PartyKeys:
    return PartyKeys.derive_from(SECRET, CFG, gm(name), parties(CFG))


def test_the_users_gm_is_believed() -> None:
    sub, data = submitter(), body()
    take(sub, OutcomeSealer(gm_keys("gm0"), "gm0", epoch=5).seal(data, "u0"), data)
    assert (sub.outcomes.events, sub.outcomes.forged) == (1, 0)
    assert list(sub.outcomes.finished) == [Task(spec=SPEC).key]


def test_unsealed_or_forged_outcomes_are_dropped() -> None:
    """Before: any LM could publish ``user.u0.lm0`` and the submitter believed it."""
    sub, data = submitter(), body()
    lm0 = Access(lm("lm0"), CFG, PartyKeys.derive_from(SECRET, CFG, lm("lm0"), parties(CFG)))
    forgeries: list[tuple[dict[str, object] | None, bytes]] = [
        (None, data),  # unsealed
        # an LM, with its sealing key to gm0, as gm0
        (
            dict(
                sealing.seal(
                    data,
                    gm("gm0"),
                    1,
                    1,
                    lm0.secret.channel_key(lm("lm0"), gm("gm0"), "amqp"),
                    stream=STREAM,
                )
            ),
            data,
        ),
        # another GM sealing for u0 (not its user) under its own key for u0
        (dict(OutcomeSealer(gm_keys("gm1"), "gm1", epoch=1).seal(data, "u0")), data),
        # gm0 sealed this for u1; replayed onto u0's stream
        (dict(OutcomeSealer(gm_keys("gm0"), "gm0", epoch=1).seal(data, "u1")), data),
        # u0 itself (it holds its key) cannot make a body naming another GM pass either
        (
            dict(
                sealing.seal(
                    body("gm1"), gm("gm0"), 1, 2, outcome_key(SECRET, "gm0", "u0"), stream=STREAM
                )
            ),
            body("gm1"),
        ),
    ]
    for headers, raw in forgeries:
        take(sub, headers, raw)
    assert sub.outcomes.events == 0
    assert sub.outcomes.forged == len(forgeries)
    assert not sub.outcomes.finished


def test_a_sealed_refusal_is_taken_and_an_unsealed_one_is_not() -> None:
    sub = submitter()
    notice = codec.encode(
        JobRefusal(gm=GmId("gm0"), user=UserId("u0"), job_id=JobId("j9"), submitted_at=1.0,
                   reason="bad_token", detail="")
    )  # fmt: skip
    take(sub, None, notice)
    assert sub.outcomes.forged == 1
    take(sub, OutcomeSealer(gm_keys("gm0"), "gm0", epoch=1).seal(notice, "u0"), notice)
    assert sub.outcomes.forged == 1


def test_a_user_holds_only_its_own_outcome_key() -> None:
    """What the operator hands ``u0`` checks gm0's outcomes to u0 and nothing else."""
    k = outcome_key(SECRET, "gm0", "u0")
    assert k not in {outcome_key(SECRET, "gm0", "u1"), outcome_key(SECRET, "gm1", "u0")}
    assert k == outcome_key(gm_keys("gm0"), "gm0", "u0")  # the GM derives it from its own
    assert user("u0") != OPERATOR
