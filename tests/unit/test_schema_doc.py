"""docs/messages.schema.json is the schema of today's messages, and it describes them:
every recorded wire sample is valid under it, and broken ones are not."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonschema
import msgpack
import pytest

from common import schema_doc
from tests.wire_samples import FIXTURE

SAMPLES: dict[str, str] = json.loads(FIXTURE.read_text())


def test_the_committed_schema_is_current() -> None:
    assert schema_doc.DEFAULT_OUT.read_text() == schema_doc.render(), (
        "run: python -m common.schema_doc"
    )


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    doc = schema_doc.schema()
    cls = jsonschema.validators.validator_for(doc)
    cls.check_schema(doc)
    return cls(doc)


def json_model(x: Any) -> Any:
    """A decoded body in JSON's data model, which the schema describes: bytes (a task's
    output) are base64 strings there, as ``msgspec.json`` writes them."""
    if isinstance(x, bytes):
        return base64.b64encode(x).decode()
    if isinstance(x, dict):
        return {k: json_model(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_model(v) for v in x]
    return x


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_recorded_sample_is_valid(
    name: str, validator: jsonschema.protocols.Validator
) -> None:
    validator.validate(json_model(msgpack.unpackb(bytes.fromhex(SAMPLES[name]))))


@pytest.mark.parametrize(
    "body",
    [
        ["decide", 2, {"max_tasks": 0}],
        ["decide", 3, {"max_tasks": 1}],
        ["decide", 2, {"max_tasks": 1, "evil": 1}],
        ["snapshot_request", 2, {"gm": "gm 0", "lm": "lm0"}],
        ["snapshot_request", 2, {"gm": "gm0", "lm": "lm0\n"}],
        ["snapshot_request", 2, {"gm": "gm0"}],
        ["no_such_tag", 2, {}],
    ],
)
def test_broken_bodies_are_not(
    body: list[object], validator: jsonschema.protocols.Validator
) -> None:
    assert not validator.is_valid(body)
