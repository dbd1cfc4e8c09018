"""The JSON Schema of every wire message, generated from the declarations for the docs.

A body is msgpack of ``[tag, schema version, fields]``; the schema describes it in
JSON's data model (a msgpack array is a JSON array, a map an object), one alternative
per registered tag, with every struct under ``$defs`` as msgspec derives it from
``common.messages`` (types, bounds, required fields, ``additionalProperties: false``).

    python -m common.schema_doc                  # writes docs/messages.schema.json
    python -m common.schema_doc --check          # exit 1 if that file is not current
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from common.codec import SCHEMA_VERSION
from common.schema import REGISTRY

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "messages.schema.json"


def _tidy(node: Any) -> Any:
    """Docstrings as written (indentation removed); fields stay in declaration (wire) order."""
    if isinstance(node, dict):
        out = {k: _tidy(v) for k, v in node.items()}
        if isinstance(out.get("description"), str):
            out["description"] = inspect.cleandoc(out["description"])
        return out
    if isinstance(node, list):
        return [_tidy(v) for v in node]
    return node


def schema() -> dict[str, Any]:
    """The JSON Schema of a message body (any registered tag)."""
    tags = sorted(REGISTRY)
    refs, defs = msgspec.json.schema_components([REGISTRY[t] for t in tags])
    one_of = [
        {
            "title": tag,
            "type": "array",
            "prefixItems": [{"const": tag}, {"const": SCHEMA_VERSION}, ref],
            "items": False,
            "minItems": 3,
        }
        for tag, ref in zip(tags, refs, strict=True)
    ]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"Megha wire messages, schema version {SCHEMA_VERSION}",
        "description": (
            "A body is msgpack of [tag, schema version, fields], shown here in JSON's data "
            "model. Generated from the common/messages package by `python -m common.schema_doc`; "
            "do not edit."
        ),
        "oneOf": one_of,
        "$defs": _tidy(dict(sorted(defs.items()))),
    }


def render() -> str:
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the schema")
    ap.add_argument("--check", action="store_true", help="only check the file is current")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.is_file() and args.out.read_text() == text
        print(f"{args.out}: {'current' if current else 'out of date'}", file=sys.stderr)
        return 0 if current else 1
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(REGISTRY)} messages)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
