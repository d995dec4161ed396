"""``linkescape bench --memory``: resident memory stays flat whatever buffers a job hands the communicator.

Every case (:mod:`.cases`) runs on buffers allocated afresh for every call
and, beside it, on reused buffers (the control); :mod:`.verdict` says what
flat means, :mod:`.run` runs the ranks (:mod:`.rank`) and prints the table.
"""

from .cases import Case, matrix, quick, select, sized
from .run import MemoryBenchError, run_case, run_memory
from .verdict import allowance, fit, judge, judge_series

__all__ = ["Case", "matrix", "quick", "select", "sized", "run_case", "run_memory", "MemoryBenchError", "fit",
           "judge", "judge_series", "allowance"]
