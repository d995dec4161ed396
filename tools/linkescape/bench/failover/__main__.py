"""``python -m linkescape.bench.failover``: the failover benchmark without the ``linkescape bench`` wiring."""

from .cli import main

main()
