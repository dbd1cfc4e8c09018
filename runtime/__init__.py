"""The driver runtime the GM, LM and worker services share.

A service is a pure core (``handle(message, now) -> effects``) plus this runtime:

* ``driver``: feeds the core its messages (``feed``), carries out its effects through
  a table of handlers, turns ``After`` into timers, batches what leaves per loop turn;
* ``supervisor``: every background task of a process in one ``asyncio.TaskGroup``;
* ``retry``: the one retry policy (exponential backoff with jitter, a deadline);
* ``http``: the HTTP boundary (errors to statuses, whole bodies up to a limit) and
  keep-alive peers that post one message and decode one answer;
* ``gunicorn_worker``: the worker class every service runs in (aiohttp's, serving the
  app with ``http.ServiceRunner``: even a request aiohttp's parser cannot read is
  refused with a JSON reason);
* ``broker``: the RabbitMQ topology, publishing with confirms, consuming with
  de-duplication, dead-lettering with a reason, and a hook to re-snapshot after a
  reconnect;
* ``dedup``: bounded memory of message ids already handled;
* ``prometheus``: ``/metrics`` from the cores' typed counters.
"""
