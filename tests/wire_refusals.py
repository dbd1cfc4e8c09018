"""Bad bodies made from the wire samples, and what the codec answered to each.

Every sample of ``tests.wire_samples`` (its recorded bytes) is unpacked to plain data
and broken in one place at a time: each value in turn (every map entry, the first and
the last item of every array) is replaced by values of other types, out of range, too
long or odd; a map loses each of its keys or gains an unknown one.  A part already
broken in an earlier sample (the envelope, the same task spec) is not broken again.
``tests/fixtures/wire_refusals.json`` records, per place and way of breaking it, what
the codec of commit f166df8 answered: the error class, its reason and its field, or, for a body it
took, a digest of the message re-encoded.  ``tests/unit/test_wire_refusals.py`` checks
that today's codec answers every case the same.

Re-record (only for a deliberate change of what is refused, said in the commit):
``PYTHONPATH=. python -m tests.wire_refusals --record``.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack

from tests.wire_samples import FIXTURE as SAMPLES_FIXTURE

FIXTURE = Path(__file__).parent / "fixtures" / "wire_refusals.json"

Path_ = tuple[Any, ...]
"""Where a value sits in the plain body: keys and indexes from the envelope down."""

_ANY: dict[str, Any] = {
    "nil": None,
    "true": True,
    "minus_one": -1,
    "zero": 0,
    "big": 2**64 - 1,
    "float": 1.5,
    "inf": float("inf"),
    "nan": float("nan"),
    "text": "x",
    "empty_text": "",
    "bad_id": "has space",
    "array": [1],
    "empty_array": [],
    "map": {"k": 1},
    "bin": b"\x00",
}
"""What every value is replaced by in turn."""


def _by_kind(value: Any) -> dict[str, Any]:
    """Replacements that probe the bounds of a value of this kind."""
    if isinstance(value, bool):
        return {"int_for_bool": int(value)}
    if isinstance(value, int):
        return {
            "minus_two": -2,
            "plus_one": value + 1,
            "plus_six": value + 6,  # past every enum
            "mask_bit_21": 1 << 21,
            "float_of_it": float(value),
        }
    if isinstance(value, float):
        return {"negative": -0.5, "minus_inf": float("-inf"), "int_of_it": int(value), "max": 1e308}
    if isinstance(value, str):
        return {
            "newline": value + "\n",
            "id_201": "a" * 201,
            "id_200": "a" * 200,
            "text_4097": "t" * 4097,
            "unicode": value + "é",
            "bytes_of_it": value.encode(),
        }
    if isinstance(value, list):
        out: dict[str, Any] = {"tuple_of_17": [1] * 17, "bare_map": {}}
        if value:
            out["doubled"] = value + value[-1:]
        return out
    return {}


def _walk(value: Any, seen: set[str], path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every value to break: map entries, the first and the last item of arrays; a map
    or array already broken elsewhere (the same task spec in several samples) once."""
    if isinstance(value, dict | list):
        key = repr((path[-1] if path else None, value))
        if key in seen:
            return
        seen.add(key)
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, seen, (*path, k))
    elif isinstance(value, list):
        for i in sorted({0, len(value) - 1} if value else set()):
            yield from _walk(value[i], seen, (*path, i))


def replaced_at(root: Any, path: Path_, value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(root)
    node = out
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return out


def dropped_at(root: Any, path: Path_) -> Any:
    out = copy.deepcopy(root)
    node = out
    for step in path[:-1]:
        node = node[step]
    del node[path[-1]]
    return out


def cases() -> Iterator[tuple[str, str, bytes]]:
    """``(place, way, body)`` for every sample, place and way of breaking it."""
    recorded: dict[str, str] = json.loads(SAMPLES_FIXTURE.read_text())
    seen: set[str] = set()
    for name in sorted(recorded):
        plain = msgpack.unpackb(bytes.fromhex(recorded[name]), raw=False)
        for path, value in _walk(plain, seen):
            if len(path) < 2 and name != "admit_job":
                continue  # the envelope itself: broken in the first sample only
            where = f"{name}|{'/'.join(map(str, path))}"
            for label, new in {**_ANY, **_by_kind(value)}.items():
                if isinstance(new, int) and not -(2**63) <= new < 2**64:
                    continue  # msgpack has no such integer
                yield where, label, msgpack.packb(replaced_at(plain, path, new), use_bin_type=True)
            if isinstance(value, dict):
                for k in value:
                    yield where, f"drop:{k}", msgpack.packb(dropped_at(plain, (*path, k)))
                extra = replaced_at(plain, path, {**value, "evil": 1})
                yield where, "unknown_key", msgpack.packb(extra, use_bin_type=True)
                yield where, "int_key", msgpack.packb(replaced_at(plain, path, {**value, 1: 1}))


def answer(body: bytes) -> str:
    """What the codec makes of ``body``, as one comparable string."""
    from common import codec
    from common.errors import DecodeError, ValidationError

    try:
        msg = codec.decode(body)
    except ValidationError as e:
        return f"ValidationError|{e.reason}|{e.path}"
    except DecodeError as e:
        return f"DecodeError|{e.reason}"
    return "ok|" + hashlib.sha256(codec.encode(msg)).hexdigest()[:16]


def record(path: Path = FIXTURE) -> int:
    out: dict[str, dict[str, str]] = {}
    for where, way, body in cases():
        out.setdefault(where, {})[way] = answer(body)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(out.items())]
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    return sum(map(len, out.values()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--record", action="store_true", help=f"write {FIXTURE.name} anew")
    args = ap.parse_args(argv)
    if not args.record:
        ap.print_help()
        return 0
    print(f"wrote {record()} cases to {FIXTURE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
