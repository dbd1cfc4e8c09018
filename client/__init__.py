"""A Python client of a Megha federation's front door (the GMs' ``/api/v1``).

    from client import Client, JobDef

    fed = Client.connect(user="u0")                  # $MEGHA_HOME: its config and token
    job = fed.submit(JobDef.single(4, [1], 2.0))     # or JobDef from load_job("job.json")
    print(job.status().state)                        # queued, running, finished, ...
    job.wait()                                       # until it ended; JobStatus
    job.cancel()
    for task in job.results():                       # each task's state, attempts, exit code
        print(task.task_id, task.state, task.exit_code, fed.logs(task.task_id))

``AsyncClient`` does the same with ``await`` (``async with AsyncClient.connect(...)``).
Errors are ``FrontDoorError`` with the server's ``reason`` (``unknown_job``,
``bad_token``, ``revoked_token``, ``bad_job_file``, ...) and one line of detail.
"""

from client.api import (
    AsyncClient,
    AsyncJobHandle,
    Client,
    FrontDoorError,
    JobHandle,
    JobView,
    TaskView,
)
from common.jobspec import JobDef, load_job, parse_job

__all__ = [
    "AsyncClient",
    "AsyncJobHandle",
    "Client",
    "FrontDoorError",
    "JobDef",
    "JobHandle",
    "JobView",
    "TaskView",
    "load_job",
    "parse_job",
]
