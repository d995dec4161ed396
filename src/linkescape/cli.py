"""The ``linkescape`` command: bench, testbed, fault, demo."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="linkescape")
def main() -> None:
    """linkescape: collectives over multi-rail TCP that survive link failures."""


def _register() -> None:
    # Each integration owns its commands; import errors surface as they happen.
    from .bench.cli import bench
    from .testbed.cli import fault, testbed
    from .demo import demo

    main.add_command(bench)
    main.add_command(testbed)
    main.add_command(fault)
    main.add_command(demo)


try:
    _register()
except ImportError as exc:  # pragma: no cover - only while a part is missing
    import sys

    print(f"linkescape: some commands are unavailable: {exc}", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    main()
