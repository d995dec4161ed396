"""A pytest plugin (``-p gloo_to_linkescape``) that runs torchft's own tests
with linkescape's group where they use torchft's Gloo group: torchft's
``ProcessGroupGloo`` name is bound to :class:`ProcessGroupLinkescape` before
the test modules import it. tests/torchft/test_torchft_suite.py runs torchft's
``process_group_test.py`` and ``manager_integ_test.py`` with and without it."""

from __future__ import annotations


def pytest_configure(config) -> None:
    import torchft
    import torchft.process_group as tpg

    from linkescape.torchft import ProcessGroupLinkescape

    tpg.ProcessGroupGloo = ProcessGroupLinkescape
    torchft.ProcessGroupGloo = ProcessGroupLinkescape


def pytest_report_header(config) -> str:
    return "torchft's ProcessGroupGloo is linkescape.torchft.ProcessGroupLinkescape in this run"
