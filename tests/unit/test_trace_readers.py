"""The published traces' readers on small samples written with the formats' documented
columns: Google 2011 ``task_events`` and 2019 ``instance_events``, Alibaba 2018
``batch_task``; gzip or plain, several files, streamed with bounded memory."""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.errors import ConfigError
from workload.alibaba import MAX_TRACE_JOB_TASKS, AlibabaReplay, TraceStage
from workload.google import GoogleReplay, read_google
from workload.spill import sorted_spilled
from workload.traces import TraceJob

S = 1_000_000  # microseconds


def task_event(t: float, job: int, index: int, kind: int) -> str:
    """A 2011 ``task_events`` row: timestamp, missing info, job ID, task index, machine
    ID, event type, user, scheduling class, priority, CPU, memory, disk, different-machine."""
    return f"{int(t * S)},,{job},{index},{'' if kind == 0 else 42},{kind},u=,2,0,0.03,0.01,0.0001,0"


# job 100: two tasks, one evicted and run again; job 200 finishes before job 100 but
# arrives after it; job 300 is killed before it runs; job 400 runs past the trace's end
EVENTS_2011 = [
    (0, 100, 0, 0), (0, 100, 1, 0), (1, 100, 0, 1), (1, 100, 1, 1), (2, 200, 0, 0),
    (2, 200, 0, 1), (3, 100, 1, 2), (4, 200, 0, 4), (4, 100, 1, 0), (5, 100, 1, 1),
    (5, 300, 0, 0), (6, 300, 0, 5), (6, 400, 0, 0), (6, 400, 0, 1), (8, 100, 1, 4),
    (11, 100, 0, 4),
]  # fmt: skip
EXPECTED = [TraceJob(0.0, (5.0, 10.0)), TraceJob(2.0, (2.0,)), TraceJob(6.0, (5.0,))]


def write(path: Path, lines: list[str], *, gz: bool = False) -> Path:
    text = "".join(line + "\n" for line in lines)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_google2011_task_events_become_jobs_in_arrival_order(tmp_path: Path) -> None:
    rows = [task_event(*e) for e in EVENTS_2011]
    # two part files, the first gzipped (told by its bytes, not its name)
    a = write(tmp_path / "part-00000-of-00500.csv", rows[:7], gz=True)
    b = write(tmp_path / "part-00001-of-00500.csv.gz", rows[7:])
    replay = read_google("google2011", [a, b])
    assert list(replay) == EXPECTED
    s = replay.stats
    assert (s.events, s.jobs, s.tasks) == (16, 3, 4)
    assert (s.never_ran, s.unfinished, s.clipped) == (1, 1, 0)
    assert replay.held_tasks == 0


def test_google2019_instance_events_with_their_header(tmp_path: Path) -> None:
    kinds = {0: 0, 1: 3, 2: 4, 4: 6, 5: 7}  # 2011 event type -> 2019's
    head = "time,type,collection_id,scheduling_class,missing_type,collection_type,priority,"
    head += "alloc_collection_id,instance_index,machine_id,alloc_instance_index"
    rows = [head]
    for t, job, index, kind in EVENTS_2011:
        rows.append(f"{int(t * S)},{kinds[kind]},{job},1,,0,200,0,{index},7,-1")
        if t == 2:  # an alloc set's instance: a reservation, not work
            rows.append(f"{int(t * S)},0,999,1,,1,200,0,0,7,-1")
    replay = read_google("google2019", [write(tmp_path / "instance_events.csv", rows)])
    assert list(replay) == EXPECTED
    assert replay.stats.skipped_rows == 2
    bad = write(tmp_path / "no_header.csv", rows[1:])
    with pytest.raises(ConfigError, match=r"no_header.csv:1: the header names no time"):
        list(read_google("google2019", [bad]))


def test_a_task_open_past_the_lookahead_is_cut_and_later_events_ignored(tmp_path: Path) -> None:
    events = [(0, 1, 0, 0), (0, 1, 0, 1), (1, 2, 0, 0), (1, 2, 0, 1), (2, 2, 0, 4)]
    events += [(20, 3, 0, 0), (20, 3, 0, 1), (21, 3, 0, 4), (100, 1, 0, 4)]
    events += [(101, 4, 0, 1), (102, 4, 0, 4)]  # a SCHEDULE without its SUBMIT (missing data)
    path = write(tmp_path / "t.csv", [task_event(*e) for e in events])
    replay = read_google("google2011", [path], lookahead=10.0)
    jobs = iter(replay)
    assert next(jobs) == TraceJob(0.0, (10.0,))  # cut 10 s after its arrival
    assert next(jobs) == TraceJob(1.0, (1.0,))
    assert list(jobs) == [TraceJob(20.0, (1.0,)), TraceJob(101.0, (1.0,))]
    assert (replay.stats.clipped, replay.stats.unmatched) == (1, 1)  # job 1's late FINISH


def test_rows_out_of_time_order_and_malformed_rows_are_errors_naming_them(
    tmp_path: Path,
) -> None:
    back = write(tmp_path / "back.csv", [task_event(5, 1, 0, 0), task_event(4, 1, 0, 1)])
    with pytest.raises(ConfigError, match=r"back.csv:2: time 4000000 goes back") as e:
        list(read_google("google2011", [back]))
    assert e.value.reason == "bad_trace"
    short = write(tmp_path / "short.csv", ["0,,1,0"])
    with pytest.raises(ConfigError, match=r"short.csv:1: 4 field\(s\), a task_events row has"):
        list(read_google("google2011", [short]))
    typ = write(tmp_path / "type.csv", ["0,,1,0,,9,u,0,0,0,0,0,0"])
    with pytest.raises(ConfigError, match=r"type.csv:1: event type '9' is not 0-8"):
        list(read_google("google2011", [typ]))
    broken = tmp_path / "broken.csv.gz"
    broken.write_bytes(gzip.compress(b"0,,1,0,,0,u,0,0,0,0,0,0\n" * 100)[:40])
    with pytest.raises(ConfigError, match="cannot read trace") as e:
        list(read_google("google2011", [broken]))
    assert e.value.reason == "trace_unreadable"


def test_the_google_reader_holds_what_the_lookahead_spans_not_the_trace() -> None:
    """50,000 one-task jobs, one every 0.1 s, each running 5 s (one in ten never ends):
    the tasks held never exceed those of the last lookahead's span."""

    def events() -> Iterator[tuple[int, str, int, int, str]]:
        for k in range(50_000):
            t = k * S // 10
            yield t, f"j{k}", 0, 0, "-"
            yield t, f"j{k}", 0, 1, "-"
            if k >= 50 and (k - 50) % 10:
                yield t, f"j{k - 50}", 0, 3, "-"

    replay = GoogleReplay(events(), lookahead=60.0)
    held = 0
    jobs = 0
    for _ in replay:
        jobs += 1
        held = max(held, replay.held_tasks)
    assert jobs == 50_000
    assert held <= 60 * 10 + 2
    assert replay.stats.clipped > 4_900


def test_a_lookahead_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        GoogleReplay(iter(()), lookahead=0.0)
    assert GoogleReplay(iter(()), lookahead=math.inf).lookahead == math.inf


def batch_task(name: str, n: int, job: str, status: str, start: int, end: int) -> str:
    """A ``batch_task`` row: task_name, instance_num, job_name, task_type, status,
    start_time, end_time, plan_cpu, plan_mem."""
    return f"{name},{n},{job},1,{status},{start},{end},100,0.39"


def test_alibaba2018_batch_tasks_become_dag_jobs_by_arrival(tmp_path: Path) -> None:
    rows = [
        batch_task("M1", 2, "j_1", "Terminated", 100, 110),
        batch_task("task_Nzg3ODAwNDgxMTAwNTc2NTQ2Mw==", 3, "j_2", "Terminated", 50, 70),
        batch_task("R2_1", 1, "j_1", "Terminated", 110, 115),
        batch_task("M1", 1, "j_3", "Failed", 60, 70),
        batch_task("R2_1", 1, "j_3", "Terminated", 70, 80),
        batch_task("M1_2", 1, "j_5", "Terminated", 10, 20),
        batch_task("M2_1", 1, "j_5", "Terminated", 10, 20),
        batch_task("J3_1_2", 4, "j_1", "Terminated", 115, 120),
        batch_task("MergeTask", 1, "j_2", "Terminated", 71, 72),
        batch_task("M1", 1, "j_6", "Waiting", 0, 0),
    ]
    a = write(tmp_path / "batch_task.csv", rows[:5], gz=True)
    b = write(tmp_path / "batch_task_2.csv", rows[5:])
    replay = AlibabaReplay([a, b], chunk=2)  # spill runs of two rows: the sort is external
    jobs = list(replay)
    assert [(j.name, j.arrival) for j in jobs] == [("j_2", 50.0), ("j_3", 70.0), ("j_1", 100.0)]
    j2, j3, j1 = jobs
    assert j1.stages == (
        TraceStage(1, (), 2, 10.0), TraceStage(2, (1,), 1, 5.0), TraceStage(3, (1, 2), 4, 5.0)
    )  # fmt: skip
    assert j2.stages == (TraceStage(1, (), 3, 20.0), TraceStage(2, (), 1, 1.0))
    assert j3.stages == (TraceStage(2, (), 1, 10.0),)  # its parent failed: not replayed
    s = replay.stats
    assert (s.rows, s.jobs, s.tasks, s.not_replayed) == (10, 3, 12, 2)
    assert (s.dropped_parents, s.skipped_jobs) == (1, 1)  # j_5's names form a cycle


def test_a_job_of_more_instances_than_a_replay_holds_is_skipped_not_built(
    tmp_path: Path,
) -> None:
    """A garbled ``instance_num`` (10**12) took every byte of memory: now its job is
    counted and skipped before anything is made of it; a job at the bound is replayed."""
    rows = [
        batch_task("M1", 10**12, "j_1", "Terminated", 100, 110),
        batch_task("R2_1", 2, "j_1", "Terminated", 110, 115),
        batch_task("M1", MAX_TRACE_JOB_TASKS - 1, "j_2", "Terminated", 120, 130),
        batch_task("R2_1", 1, "j_2", "Terminated", 130, 131),
        batch_task("M1", MAX_TRACE_JOB_TASKS, "j_3", "Terminated", 140, 150),
        batch_task("task_x", 1, "j_3", "Terminated", 140, 150),
    ]
    replay = AlibabaReplay([write(tmp_path / "batch_task.csv", rows)])
    assert [(j.name, sum(s.count for s in j.stages)) for j in replay] == [
        ("j_2", MAX_TRACE_JOB_TASKS)
    ]
    assert (replay.stats.oversized_jobs, replay.stats.skipped_jobs) == (2, 0)


def test_sorting_past_memory_keeps_order_and_ties() -> None:
    items = [(k * 7919 % 1000, k) for k in range(5_000)]
    got = list(sorted_spilled(iter(items), key=lambda x: x[0], chunk=300))
    assert got == sorted(items, key=lambda x: x[0])


def test_a_byte_order_mark_is_not_read_as_part_of_the_first_field(tmp_path: Path) -> None:
    """A BOM (an export saved by a Windows tool) made ``\\ufeffM1`` no DAG name: the
    first stage lost its number and its children their dependency on it, silently
    (a 2011 file was refused, a 2019 header had no ``time`` column)."""
    bom = b"\xef\xbb\xbf"
    rows = [
        batch_task("M1", 2, "j_1", "Terminated", 100, 110),
        batch_task("R2_1", 1, "j_1", "Terminated", 110, 115),
        batch_task("J3_1_2", 4, "j_1", "Terminated", 115, 120),
    ]
    plain = write(tmp_path / "plain.csv", rows)
    for name, gz in (("bom.csv", False), ("bom.csv.gz", True)):
        data = bom + plain.read_bytes()
        path = tmp_path / name
        path.write_bytes(gzip.compress(data) if gz else data)
        replay = AlibabaReplay([path])
        assert list(replay) == list(AlibabaReplay([plain]))
        assert replay.stats.dropped_parents == 0
    g = write(tmp_path / "g.csv", [task_event(*e) for e in EVENTS_2011])
    (tmp_path / "g_bom.csv").write_bytes(bom + g.read_bytes())
    assert list(read_google("google2011", [tmp_path / "g_bom.csv"])) == EXPECTED
    head = "time,type,collection_id,instance_index"
    rows19 = [head, "0,0,7,0", f"{S},3,7,0", f"{3 * S},6,7,0"]
    (tmp_path / "i.csv").write_bytes(bom + "\n".join(rows19).encode() + b"\n")
    assert list(read_google("google2019", [tmp_path / "i.csv"])) == [TraceJob(0.0, (2.0,))]


def test_a_2019_header_after_blank_lines_is_the_header(tmp_path: Path) -> None:
    """The header was looked for on line 1 only: after a blank line it was read as
    data and the run crashed with a KeyError (the sweep retried it, then exit 1)."""
    rows = ["", "time,type,collection_id,instance_index", "0,0,7,0", f"{S},3,7,0"]
    rows += [f"{3 * S},6,7,0"]
    a = write(tmp_path / "a.csv", rows)
    b = write(tmp_path / "b.csv", ["", "", "time,type,collection_id,instance_index"])
    b.write_text(b.read_text() + f"{4 * S},0,8,0\n{5 * S},3,8,0\n{6 * S},6,8,0\n")
    empty = write(tmp_path / "empty.csv", [""])
    replay = read_google("google2019", [a, empty, b])
    assert list(replay) == [TraceJob(0.0, (2.0,)), TraceJob(4.0, (1.0,))]
    bad = write(tmp_path / "bad.csv", ["", "t,type,collection_id,instance_index", "0,0,7,0"])
    with pytest.raises(ConfigError, match=r"bad.csv:2: the header names no time column"):
        list(read_google("google2019", [bad]))


def test_a_task_is_cut_at_the_lookahead_however_far_the_next_row_is(tmp_path: Path) -> None:
    """A task open past the lookahead ran until the row that found it open: with a
    day between rows (a trace filtered to a few jobs) a 10-s lookahead gave a task of
    a day.  And a row past the lookahead (its FINISH) is not read into the cut job."""
    events = [(0, 1, 0, 0), (0, 1, 0, 1), (0, 1, 1, 0), (2, 1, 1, 1)]
    events += [(86_400, 2, 0, 0), (86_400, 2, 0, 1), (86_401, 1, 0, 4), (86_402, 2, 0, 4)]
    path = write(tmp_path / "t.csv", [task_event(*e) for e in events])
    replay = read_google("google2011", [path], lookahead=10.0)
    assert list(replay) == [TraceJob(0.0, (10.0, 8.0)), TraceJob(86_400.0, (2.0,))]
    assert (replay.stats.clipped, replay.stats.unmatched) == (2, 1)
    # a FINISH on the lookahead's last second still ends its task
    near = write(tmp_path / "near.csv", [task_event(*e) for e in events[:4]] + [
        task_event(10, 1, 0, 4), task_event(10, 1, 1, 4)
    ])  # fmt: skip
    assert list(read_google("google2011", [near], lookahead=10.0)) == [TraceJob(0.0, (10.0, 8.0))]


def test_a_negative_time_is_an_error_naming_its_row(tmp_path: Path) -> None:
    """A negative timestamp was read: its task was replayed from time 0 while its
    job's completion time counted from the negative arrival (5 s too long here)."""
    rows = [task_event(1, 1, 0, 0), task_event(2, 1, 0, 1), task_event(3, 1, 0, 4)]
    neg = write(tmp_path / "neg.csv", ["-5000000,,1,0,,0,u,0,0,0,0,0,0", *rows])
    with pytest.raises(ConfigError, match=r"neg.csv:1: timestamp '-5000000' is negative") as e:
        list(read_google("google2011", [neg]))
    assert e.value.reason == "bad_trace"
    head = "time,type,collection_id,instance_index"
    neg19 = write(tmp_path / "neg19.csv", [head, "-1,0,7,0", "0,3,7,0", "5,6,7,0"])
    with pytest.raises(ConfigError, match=r"neg19.csv:2: time '-1' is negative"):
        list(read_google("google2019", [neg19]))
