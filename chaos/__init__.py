"""``megha chaos``, the fault-injection suite, as a library: ``chaos.scenarios`` (the
scenario file), ``chaos.stage`` (a scenario's broker, hosts and federation),
``chaos.drive`` (the load, the faults, the check: lost tasks, duplicate launches,
recovery time), ``chaos.results`` (verdicts and files), ``chaos.netns_bench``
(allocation times against added latency).  ``tests/chaos`` runs the quick subset.
"""
