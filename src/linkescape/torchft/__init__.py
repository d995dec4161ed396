"""linkescape under torchft: :class:`ProcessGroupLinkescape`, a torchft process group.

torchft (``pip install 'linkescape[torchft]'``, torchft 0.2.0) reconfigures its
process group at every quorum; this one builds a linkescape group
(:class:`linkescape.torch.ProcessGroupLinkEscape`) per quorum, so a cable cut,
a blackholed optic or a flap costs no quorum change, and a host that loses
every rail is left out by torchft's next quorum::

    from linkescape.torchft import ProcessGroupLinkescape
    manager = torchft.Manager(pg=ProcessGroupLinkescape(timeout=timedelta(seconds=10)), ...)

Only this package imports torchft; ``import linkescape`` does not.
"""

from __future__ import annotations

from .. import _tools_half
from ..common.extras import require

# torchft's demos and measurements (demo, run, train, analysis, configure_time) are tools:
# tools/linkescape/torchft in a source checkout
__path__ += [p for p in _tools_half("torchft") if p not in __path__]

require(["torchft"], "torchft", "linkescape.torchft")

from .process_group import ProcessGroupLinkescape  # noqa: E402 - after the check that names the extra

__all__ = ["ProcessGroupLinkescape"]
