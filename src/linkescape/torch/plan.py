"""One torch operation in the making: stage, issue, write back.

Every collective of the backend follows the same three steps: stage the
caller's tensors as host arrays the library can read or write (zero-copy
when a tensor is a contiguous CPU tensor), issue library operations on those
arrays with ``async_op=True``, and once they have all completed, copy what
was staged back into the caller's tensors. A :class:`Plan` collects the
three, so each collective only says which tensors are read, which are
written, and what to call.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import numpy as np
import torch

from . import convert
from .convert import Staged


class Plan:
    """The staging buffers, library calls and finish steps of one operation."""

    __slots__ = ("outputs", "value", "_calls", "_after", "keep")

    def __init__(self, outputs: Sequence[torch.Tensor] = ()) -> None:
        #: tensors the work hands back (``result()``, the future's value)
        self.outputs: List[torch.Tensor] = list(outputs)
        #: the future's value when it is not ``outputs`` (a list of lists,
        #: as Gloo gives for all_gather with several output lists)
        self.value: Optional[list] = None
        self._calls: List[Callable[[], object]] = []
        self._after: List[Callable[[], None]] = []
        #: buffers the library reads or writes: alive until the work completes
        self.keep: list = []

    # ---- staging
    def read(self, t: torch.Tensor) -> np.ndarray:
        """``t`` as an array the library only reads."""
        s = Staged(t, load=True)
        self.keep.append(s)
        return s.array

    def write(self, t: torch.Tensor, load: bool = False) -> np.ndarray:
        """``t`` as an array the library writes (``load``: and reads first);
        a staged copy goes back into ``t`` when the operation is done."""
        s = Staged(t, load=load)
        self.keep.append(s)
        if not convert.direct(t):
            self._after.append(s.write_back)
        return s.array

    def update(self, t: torch.Tensor) -> np.ndarray:
        """``t`` read and written in place (all_reduce, broadcast on the root...)."""
        return self.write(t, load=True)

    def stacked(self, tensors: Sequence[torch.Tensor], what: str) -> np.ndarray:
        """Equal tensors as one host array of shape ``(len, ...)`` (read only)."""
        host, arr = convert.stack_inputs(tensors, what)
        self.keep.append(host)
        return arr

    def rows_into(self, tensors: Sequence[torch.Tensor], shape, dtype: torch.dtype) -> np.ndarray:
        """A host array of shape ``(len(tensors), *shape)`` whose rows are
        copied into ``tensors`` when the operation is done."""
        host = torch.empty((len(tensors), *shape), dtype=dtype)
        self.keep.append(host)
        self._after.append(convert.unstack_to(host, tensors))
        return convert.to_numpy(host)

    def buffer(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """A scratch host tensor kept alive with the operation."""
        host = torch.empty(tuple(shape), dtype=dtype)
        self.keep.append(host)
        return host

    # ---- calls and finish steps
    def issue(self, call: Callable[[], object]) -> None:
        """``call()`` posts library operations (a Work or a list of Works)."""
        self._calls.append(call)

    def then(self, step: Callable[[], None]) -> None:
        """A finish step, run after the library operations, in order."""
        self._after.append(step)

    def start(self) -> list:
        parts: list = []
        for call in self._calls:
            got = call()
            if isinstance(got, (list, tuple)):
                parts.extend(got)
            elif got is not None:
                parts.append(got)
        return parts

    def finish(self) -> Optional[Callable[[], None]]:
        steps = list(self._after)
        if not steps:
            return None
        if len(steps) == 1:
            return steps[0]

        def run() -> None:
            for step in steps:
                step()
        return run


__all__ = ["Plan"]
