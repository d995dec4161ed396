"""linkescape.ops: which dtypes reduce, and what importing it costs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from linkescape import ops


def test_importing_linkescape_does_not_import_ml_dtypes():
    # ml_dtypes costs ~1.2 s of CPU to import: every rank of a numpy-only job paid it at start
    code = ("import sys, linkescape, linkescape.communicator, linkescape.testbed.exact\n"
            "assert 'ml_dtypes' not in sys.modules, 'ml_dtypes imported'\n"
            "import numpy as np\n"
            "from linkescape import ops\n"
            "assert ops.is_half(np.dtype(np.float16)) and not ops.is_half(np.dtype('V2'))\n"
            "assert 'ml_dtypes' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_bfloat16_is_a_half_type_once_asked_for():
    bf16 = ops.bfloat16()
    assert bf16 is not None and bf16.name == "bfloat16" and ops.BFLOAT16 == bf16
    assert ops.is_half(bf16) and ops.supported_dtype(bf16)
    assert not ops.is_half(np.dtype(np.float32)) and ops.supported_dtype(np.dtype(np.int8))
