"""``python -m testbed``: remove leftovers of crashed runs, or measure what latency adds.

* ``python -m testbed sweep`` removes the namespaces, links, processes and broker
  sandboxes of test-bed runs whose owner died; live runs are never touched.
* ``python -m testbed rtt --delays 0,1,5,10`` makes two hosts, sets each delay on one
  of them, and prints the TCP round trips measured (min, p50, p90, max, in ms).
"""

from __future__ import annotations

import argparse
import sys

from common.metrics import percentiles
from testbed import netns, rabbit


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the command."""
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sweep", help="remove what crashed test-bed runs left behind")
    rtt = sub.add_parser("rtt", help="measure round trips against added latency")
    rtt.add_argument("--delays", default="0,1,2,5,10", help="comma-separated delays in ms")
    rtt.add_argument("--jitter", type=float, default=0.0, help="jitter in ms for every delay")
    rtt.add_argument("--count", type=int, default=50, help="round trips per delay")
    rtt.add_argument("--both", action="store_true", help="delay both hosts, not only one")
    rtt.add_argument("--backend", choices=["auto", "netem", "tap"], default="auto")
    args = parser.parse_args(argv)
    if args.command == "sweep":
        for name in [*netns.sweep(), *rabbit.sweep()]:
            print(f"removed {name}")
        return 0
    delays = [float(d) for d in args.delays.split(",") if d.strip()]
    with netns.Testbed(["a", "b"], backend=args.backend) as bed:
        print(f"backend {bed.backend}; RTT a<->b over TCP, {args.count} round trips each")
        print(f"{'delay ms':>9} {'expected':>9} {'min':>8} {'p50':>8} {'p90':>8} {'max':>8}")
        for delay in delays:
            jitter = min(args.jitter, delay)
            for host in ("a", "b") if args.both else ("a",):
                if delay > 0:
                    bed.set_latency(host, delay, jitter)
                else:
                    bed.clear_latency(host)
            samples = bed.tcp_rtt("a", "b", count=args.count)
            p = percentiles(samples)
            expected = delay * (2 if args.both else 1)
            print(
                f"{delay:>9g} {expected:>9g} {min(samples):>8.3f} {p['p50']:>8.3f}"
                f" {p['p90']:>8.3f} {p['max']:>8.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
