import signal
import sys

from linkescape.testbed.pytest_fixtures import testbed, testbed_factory  # noqa: F401


def _terminate(signum, frame):
    # A killed test run (CI timeout, Ctrl-C from a wrapper) must still tear
    # down the testbeds it made: turn SIGTERM into SystemExit so that fixture
    # finalizers and atexit hooks run.
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, _terminate)
