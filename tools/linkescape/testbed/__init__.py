"""A multi-host, multi-rail cluster on one Linux machine: namespaces, bridges, veth, faults.

Floors, lowest first: :mod:`.shell` (errors, helper commands), :mod:`.nft`
(the tables of silent faults), :mod:`.netns` (the testbed itself),
:mod:`.faults` (cut, blackhole, lossy, flap, repair, restore: they need a
testbed; the testbed does not need them). Importing this package loads
:mod:`.faults`, which gives :class:`Testbed` its fault methods.
"""

from . import faults  # noqa: F401  (the Testbed's fault methods)
from .netns import Testbed, TestbedError, down, temporary_testbed

__all__ = ["Testbed", "TestbedError", "down", "temporary_testbed", "faults"]
