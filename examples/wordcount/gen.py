"""Set up a word count in a shared directory and print its job file.

    python3 examples/wordcount/gen.py /srv/megha-shared/wc --files 4 --reducers 2 > wc.json
    megha submit wc.json --user u0 --wait

Writes ``DIR/input/part-<i>.txt`` (generated text: words drawn with a Zipf-like skew
from a fixed vocabulary, seeded), copies ``wc.py`` to ``DIR``, makes ``DIR/map`` and
``DIR/out`` writable by the tasks' uids, and prints a megha-job/1 job of two stages:
``--files`` map tasks, then ``--reducers`` reduce tasks that wait for them.  The
answer (``DIR/expected.json``) is counted here too, for checking ``DIR/out``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import sys
from pathlib import Path

VOCAB = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "that",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "from",
    "have",
    "or",
    "by",
    "one",
    "had",
    "not",
    "but",
    "what",
    "all",
    "were",
    "when",
    "we",
    "there",
    "can",
    "an",
    "your",
    "which",
    "their",
    "said",
    "if",
    "do",
    "will",
    "each",
    "about",
    "how",
    "up",
    "out",
    "them",
    "then",
    "she",
    "many",
    "some",
    "so",
    "these",
    "would",
    "other",
    "into",
    "has",
    "more",
    "her",
    "two",
    "like",
    "him",
    "see",
    "time",
    "could",
    "no",
    "make",
    "than",
    "first",
    "been",
    "its",
    "who",
    "now",
    "people",
    "my",
    "made",
    "over",
    "did",
    "down",
    "only",
    "way",
    "find",
    "use",
    "may",
    "water",
    "long",
    "little",
]


def generate(root: Path, files: int, words: int, seed: int) -> collections.Counter[str]:
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) for k in range(len(VOCAB))]
    expected: collections.Counter[str] = collections.Counter()
    (root / "input").mkdir(parents=True, exist_ok=True)
    for i in range(files):
        text = rng.choices(VOCAB, weights, k=words)
        expected.update(text)
        lines = [" ".join(text[j : j + 12]) for j in range(0, len(text), 12)]
        (root / "input" / f"part-{i}.txt").write_text("\n".join(lines) + "\n")
    return expected


def job(root: Path, files: int, reducers: int, python: str) -> dict[str, object]:
    wc = str(root / "wc.py")
    return {
        "format": "megha-job/1",
        "name": "wordcount",
        "stages": [
            {"id": 0, "count": files, "demand": [1], "duration": 60,
             "command": [python, wc, "map", "{i}", str(reducers), str(root)]},
            {"id": 1, "parents": [0], "count": reducers, "demand": [1], "duration": 60,
             "command": [python, wc, "reduce", "{i}", str(files), str(root)]},
        ],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", help="a directory under the operator's [sandbox] shared_dir")
    p.add_argument("--files", type=int, default=4, help="input files: map tasks")
    p.add_argument("--reducers", type=int, default=2, help="reduce tasks")
    p.add_argument("--words", type=int, default=20_000, help="words per input file")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--python", default="/usr/bin/python3", help="the tasks' interpreter")
    args = p.parse_args(argv)
    root = Path(args.dir).resolve()
    expected = generate(root, args.files, args.words, args.seed)
    shutil.copy(Path(__file__).with_name("wc.py"), root / "wc.py")
    for sub in ("map", "out"):
        (root / sub).mkdir(exist_ok=True)
        os.chmod(root / sub, 0o1777)  # the tasks' uids write here
    for path in (root, root / "input"):
        os.chmod(path, 0o755)
    (root / "expected.json").write_text(json.dumps(dict(expected), sort_keys=True))
    json.dump(job(root, args.files, args.reducers, args.python), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
