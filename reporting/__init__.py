"""The runs' reports, one package for ``megha bench``, ``megha simulate`` and the DAG
runs: summaries (the same keys everywhere), task CSVs, plots, and where files go.

* ``reporting.tally``: allocation-time figures of a run's tasks (``summarize_tasks``,
  ``TaskTally`` one task at a time), job completion times;
* ``reporting.fairness``: each user's dominant share over time, Jain's index per window;
* ``reporting.tasks``: ``tasks.csv`` / ``tasks-<scheduler>.csv``, one row per task;
* ``reporting.plots``: allocation-time CDFs and components, shares over time, sweeps;
* ``reporting.live``: a live run's counters and traffic from the services' pages, its
  jobs' figures, ``summary.json`` and the raw series beside it (``series/``);
* ``reporting.sweep``: ``sweep.json`` and ``sweep.png`` over federation sizes;
* ``reporting.files``: the output directory, summary files as sorted JSON.

The percentile definition and the cores' counters are ``common.metrics``.  Reports are
made from plain data: this package imports no simulator, live driver, CLI or runtime.
"""
