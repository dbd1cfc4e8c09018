"""A federation's lifecycle, as a library: the CLI (``megha up | down | status | kill |
restart | user``), the benchmarks, the tests and ``deploy.render`` import it.

* ``federation.processes``: start, watch, signal and stop the processes of a federation
  on this machine (``running_federation`` for a ``with`` block);
* ``federation.provision``: what is made before any process starts and removed by a
  purge: the secret, the broker's vhost and users, the users' tokens;
* ``federation.users``: a user's token issued or revoked later;
* ``federation.operator``: the operator's signed reads of the services' pages and the
  broker queues' depths;
* ``federation.ports``: whether a port is free.

It imports no CLI, live driver or simulator (``lint-imports``).
"""
