"""Test-bed for fault and multi-host tests of a Megha federation on one Linux machine.

Two parts, both cleaned up on exit (also on an exception or Ctrl-C) and swept by prefix
after a crash (``python -m testbed sweep``, and automatically when a new one starts):

* ``testbed.netns.Testbed``: named hosts, each a network namespace with its own
  address on one bridge; per host, added latency / jitter / loss on what it sends, and
  partitions that cut it off silently. Run a process in a host with
  ``popen(host, argv)`` or prefix any argv with ``argv_in(host, argv)``. The root
  namespace reaches every host, and hosts reach the root namespace at ``gateway``.
* ``testbed.rabbit.RabbitSandbox``: private RabbitMQ nodes (never the shared broker on
  5672): start, wait until ready, stop, ``kill -9``, restart on the same data, and
  three-node clusters with quorum queues.

Usage::

    from testbed.netns import Testbed
    from testbed.rabbit import RabbitSandbox

    with Testbed(["gm0", "lm0", "w0"]) as bed, RabbitSandbox() as box:
        broker = box.node("broker", listen_ip=bed.gateway)
        broker.start()                                   # amqp on broker.url
        lm = bed.popen("lm0", ["python3", "-m", "http.server", "--bind", bed.address("lm0")])
        bed.set_latency("lm0", 200)                      # a slow LM: +200 ms per round trip
        bed.partition("lm0"); bed.heal("lm0")            # an LM cut off, then back
        broker.kill(); broker.start()                    # a broker crash

Both need root; ``Testbed`` needs iproute2, ``RabbitSandbox`` the Debian
``rabbitmq-server`` package. See ``testbed/README.md`` for what each guarantees and
what latency costs on this machine.
"""
