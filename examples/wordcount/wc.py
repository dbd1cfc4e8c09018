"""Word count, one task of it: ``map I R DIR`` or ``reduce R_INDEX N_MAPS DIR``.

A map task counts the words of ``DIR/input/part-I.txt`` and writes its counts split in
``R`` partitions (by a stable hash of the word) to ``DIR/map/I-r.json``; reduce task
``r`` adds up partition ``r`` of every map's output into ``DIR/out/part-r.json`` and
prints its ten most common words.  ``DIR`` is the operator's shared directory
(``[sandbox] shared_dir``): the tasks run as uids of their own, so what a map writes
is opened to the reduces (0644).  Standard library only.
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys
import zlib

WORD = re.compile(r"[a-z']+")


def write(path: str, doc: object) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def do_map(i: int, reducers: int, root: str) -> None:
    with open(f"{root}/input/part-{i}.txt", encoding="utf-8") as f:
        counts = collections.Counter(WORD.findall(f.read().lower()))
    parts: list[dict[str, int]] = [{} for _ in range(reducers)]
    for word, n in counts.items():
        parts[zlib.crc32(word.encode()) % reducers][word] = n
    for r, part in enumerate(parts):
        write(f"{root}/map/{i}-{r}.json", part)
    print(f"map {i}: {sum(counts.values())} words, {len(counts)} distinct")


def do_reduce(r: int, maps: int, root: str) -> None:
    total: collections.Counter[str] = collections.Counter()
    for i in range(maps):
        with open(f"{root}/map/{i}-{r}.json", encoding="utf-8") as f:
            total.update(json.load(f))
    write(f"{root}/out/part-{r}.json", dict(total))
    for word, n in total.most_common(10):
        print(f"{word}\t{n}")


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in ("map", "reduce"):
        print("usage: wc.py map I REDUCERS DIR | wc.py reduce R MAPS DIR", file=sys.stderr)
        return 2
    kind, a, b, root = argv[0], int(argv[1]), int(argv[2]), argv[3]
    (do_map if kind == "map" else do_reduce)(a, b, root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
