"""The ``linkescape`` command: bench, testbed, fault, demo."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="linkescape")
def main() -> None:
    """linkescape: collectives over multi-rail TCP that survive link failures."""


def _register() -> None:
    # Each integration owns its commands; one that cannot load (a missing
    # optional dependency) must not take the others down with it.
    import importlib
    import sys

    for module, names in ((".bench.cli", ("bench",)), (".testbed.cli", ("testbed", "fault")), (".demo", ("demo",)),
                          (".chaos.cli", ("chaos",)),
                          (".tools.cli", ("status", "trace", "report", "cost", "simulate"))):
        try:
            mod = importlib.import_module(module, __package__)
        except ImportError as exc:  # pragma: no cover - only while a part is missing
            print(f"linkescape: {', '.join(names)} unavailable: {exc}", file=sys.stderr)
            continue
        for name in names:
            main.add_command(getattr(mod, name))


_register()


if __name__ == "__main__":  # pragma: no cover
    main()
