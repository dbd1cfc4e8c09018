"""A chaos run's verdicts and files: ``chaos.json``, ``chaos.csv`` and ``chaos.md`` (the
markdown table that is also printed)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any


def verdict(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"ERROR {row['error']}"
    ok = row["lost"] == 0 and row["duplicate_launches"] == 0
    unseen = [k for k in row.get("expect", []) if not row.get("evidence", {}).get(k)]
    if ok and unseen:
        return f"FAIL (no {', '.join(unseen)}: the fault did not show)"
    return "ok" if ok else "FAIL"


COLUMNS = ("scenario", "fault", "submitted", "completed", "lost", "duplicate_launches",
           "recovery_s")  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of the rows (the results' and the README's)."""
    head = ["scenario", "fault", "submitted", "completed", "lost", "dup. launches",
            "recovery (s)", "verdict", "evidence (service counters)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        shown = ", ".join(f"{k} {v}" for k, v in r.get("evidence", {}).items())
        cells = [str(r.get(c, "-")) for c in COLUMNS] + [verdict(r), shown or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos.json").write_text(json.dumps({**meta, "scenarios": rows}, indent=2) + "\n")
    with (out / "chaos.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*COLUMNS, "wall_s", "failed", "duplicate_outcomes", "error"])
        for r in rows:
            w.writerow([r.get(c, "") for c in (*COLUMNS, "wall_s", "failed",
                                                "duplicate_outcomes", "error")])  # fmt: skip
    (out / "chaos.md").write_text(table(rows) + "\n")
