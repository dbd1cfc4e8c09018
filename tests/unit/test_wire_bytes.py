"""The wire form does not move: every message encodes to the bytes recorded before the
codec changed hands (``tests/fixtures/wire_messages.json``, see ``tests.wire_samples``)
and those bytes decode back to an equal message."""

from __future__ import annotations

import json

import pytest

from common import codec
from tests.wire_samples import FIXTURE, samples

RECORDED: dict[str, str] = json.loads(FIXTURE.read_text())
SAMPLES = samples()


def test_every_registered_message_has_a_recorded_sample() -> None:
    assert {name.split(".")[0] for name in RECORDED} == set(codec.tags())
    assert set(RECORDED) == set(SAMPLES)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_encodes_to_the_recorded_bytes(name: str) -> None:
    assert codec.encode(SAMPLES[name]).hex() == RECORDED[name]


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_bytes_decode_to_an_equal_message(name: str) -> None:
    msg = codec.decode(bytes.fromhex(RECORDED[name]))
    assert type(msg) is type(SAMPLES[name])
    assert msg == SAMPLES[name]
