"""The workload model, pure: what the simulator replays and ``megha bench`` submits.

* ``workload.traces``: trace formats, read strictly (a malformed line is an error naming it);
* ``workload.google``, ``workload.alibaba``: the published production traces (Google 2011
  and 2019, Alibaba 2018), streamed as they are replayed (``workload.tracefiles`` reads
  their gzip or plain CSV, ``workload.spill`` sorts what comes out of order on disk),
  ``workload.published`` makes them jobs for ``megha simulate`` and ``megha bench``;
* ``workload.synthetic``: a trace's jobs or synthetic ones as tasks (demands, constraints);
* ``workload.jobs``: a job of independent tasks, its submission message;
* ``workload.dags``: seeded synthetic DAG jobs (Carbyne's shapes), scaling, their statistics.

No clock, event loop, socket or broker (``lint-imports``); the live driver is
``request_generator``.
"""

PUBLISHED = ("google2011", "google2019", "alibaba2018")
"""The published traces' formats (``--trace-format``), read as they are replayed."""
