"""A multi-host, multi-rail cluster on one Linux machine: namespaces, bridges, veth, faults."""

from .netns import Testbed, TestbedError, down, temporary_testbed

__all__ = ["Testbed", "TestbedError", "down", "temporary_testbed"]
