"""Where a run's files go, and how its summaries are written.

Every summary file (``summary.json``, ``timing.json``, ``sweep.json``) is JSON with
sorted keys, indented by two, so two runs compare line by line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from common.errors import ConfigError


def output_dir(path: str | Path) -> Path:
    """The directory of a run's files, made now (before any work) and writable; a
    ``ConfigError`` saying why not (an existing file of that name, no such parent, no
    permission)."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ConfigError(
            f"--out {path}: cannot make the directory ({why}); choose another --out",
            reason="bad_output_dir",
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--out {path}: the directory is not writable; choose another --out",
            reason="bad_output_dir",
        )
    return out


def write_json(path: Path, doc: Any) -> None:
    """``doc`` to ``path`` as a summary file (sorted keys, indented)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def read_json(path: Path) -> Any:
    """A summary file back."""
    return json.loads(path.read_text())
