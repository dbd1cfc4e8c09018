"""Every way of breaking a wire message is answered as before the codec changed hands:
the same error class, reason and field, or for a body taken, the same message
(``tests/fixtures/wire_refusals.json``, see ``tests.wire_refusals``)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from tests.wire_refusals import FIXTURE, answer, cases

RECORDED: dict[str, dict[str, str]] = json.loads(FIXTURE.read_text())
BY_SAMPLE: dict[str, list[tuple[str, str, bytes]]] = defaultdict(list)
for _where, _way, _body in cases():
    BY_SAMPLE[_where.split("|")[0]].append((_where, _way, _body))


def test_the_cases_are_the_recorded_ones() -> None:
    made = {(where, way) for rows in BY_SAMPLE.values() for where, way, _ in rows}
    assert made == {(where, way) for where, ways in RECORDED.items() for way in ways}
    assert len(made) > 8000


@pytest.mark.parametrize("sample", sorted(BY_SAMPLE))
def test_each_broken_body_is_answered_as_recorded(sample: str) -> None:
    wrong = [
        f"{where} {way}: {got} (recorded {RECORDED[where][way]})"
        for where, way, body in BY_SAMPLE[sample]
        if (got := answer(body)) != RECORDED[where][way]
    ]
    assert not wrong, f"{len(wrong)} answers differ:\n" + "\n".join(wrong[:20])
