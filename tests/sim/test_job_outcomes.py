"""A job with a failed or refused task has failed: counted apart, kept out of the JCTs."""

from __future__ import annotations

from common.cluster import ClusterSpec
from common.dag import make_job
from common.ids import GmId, JobId, LmId, TaskId, UserId
from common.model import NodeSpec, TaskSpec, UserConfig, new_task
from simulator.config import SimConfig
from simulator.dag_run import run_policies
from simulator.jobs import JobBook
from workload.jobs import Job

GM = GmId("gm0")
USERS = [UserConfig(UserId("u1"), GM, 1.0)]


def _job(name: str, n: int) -> Job:
    specs = [
        TaskSpec(
            task_id=TaskId(f"{name}.t{i}"),
            job_id=JobId(name),
            user=UserId("u1"),
            demand=(1,),
            duration=1.0,
        )
        for i in range(n)
    ]
    return Job(JobId(name), UserId("u1"), 0.0, specs)


def test_a_job_with_a_failed_task_is_failed_not_completed() -> None:
    book = JobBook()
    ok, bad = _job("ok", 2), _job("bad", 2)
    book.add(ok)
    book.add(bad)
    for spec in ok.tasks:
        book.done(new_task(spec, 0.0), 3.0)
    book.done(new_task(bad.tasks[0], 0.0), 2.0, "failed on worker")
    book.done(new_task(bad.tasks[1], 0.0), 4.0)
    assert (book.records.jobs_completed, book.records.jobs_failed) == (1, 1)
    # refused at admission: every task fails at once, the job is failed too
    refused = _job("refused", 3)
    book.add(refused)
    for spec in refused.tasks:
        book.done_spec(spec, 5.0, "refused: impossible_resources")
    book.finish()
    kept = book.kept()
    assert kept is not None
    assert kept.job_completion == {JobId("ok"): 3.0}
    assert kept.failed_jobs == {JobId("bad"), JobId("refused")}
    assert (book.records.jobs_completed, book.records.jobs_failed) == (1, 2)
    assert book.records.failed_tasks == 4


def test_a_dag_run_counts_every_task_and_the_refused_job_as_failed() -> None:
    clusters = [ClusterSpec(LmId("lm0"), [NodeSpec((100,)) for _ in range(2)], [GM, GM])]
    jobs = [
        make_job("fits", "u1", 0.0, [(0, [((50,), 1.0), ((50,), 1.0)], [])]),
        make_job("too-big", "u1", 0.0, [(0, [((500,), 1.0)] * 3, [])]),
    ]
    summary = run_policies(jobs, clusters, [GM], USERS, ["drf"], SimConfig(), seed=1)
    s = summary["schedulers"]["drf"]
    assert s["tasks"] == 5
    assert s["tasks_started"] == 2
    assert s["failed_tasks"] == 3
    assert s["jobs_completed"] == 1
    assert s["jobs_failed"] == 1
    assert list(s["job_jct_s"]) == ["fits"]


def test_a_task_larger_than_its_gms_share_runs_once_another_gms_task_frees_the_node() -> None:
    """u0's task needs the whole node, more than gm0's users are entitled to: the policy
    hands it to the GM anyway.  It finds u1's task (of gm1) on the node and waits; that
    task's end reaches gm0 only as a view change, which must bring it back (it did not:
    it sat in the plan, unaffordable, until a job event of gm0's own that never came)."""
    g0, g1 = GmId("gm0"), GmId("gm1")
    users = [UserConfig(UserId("u0"), g0, 0.3), UserConfig(UserId("u1"), g1, 0.3)]
    clusters = [ClusterSpec(LmId("lm0"), [NodeSpec((100,))], [g0])]
    jobs = [
        make_job("other", "u1", 0.0, [(0, [((50,), 10.0)], [])]),
        make_job("big", "u0", 1.0, [(0, [((100,), 1.0)], [])]),
    ]
    policies = ["drf", "tetris", "carbyne"]
    summary = run_policies(jobs, clusters, [g0, g1], users, policies, SimConfig(), seed=1)
    for policy, s in summary["schedulers"].items():
        assert s["stuck_tasks"] == 0, policy
        assert s["tasks_started"] == 2, policy
        assert sorted(s["job_jct_s"]) == ["big", "other"], policy
