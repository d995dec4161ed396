from linkescape.testbed.pytest_fixtures import testbed, testbed_factory  # noqa: F401
