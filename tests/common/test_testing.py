"""The multi-process helpers of the tests (linkescape.common.testing)."""

from __future__ import annotations

import pytest

from linkescape.common.testing import raise_first


def test_raise_first_says_what_every_rank_that_failed_raised():
    # The first rank to fail is not always the cause: a rank that timed out and closed makes its
    # peers raise PeerLost, and rank 0's PeerLost alone hid the timeout (a start-up test's failure).
    results = [ValueError("rank 2 closed its communicator"), {"ok": 1}, TimeoutError("op 3 timed out")]
    with pytest.raises(AssertionError) as exc:
        raise_first(results)
    text = str(exc.value)
    assert text.startswith("rank 0 raised ValueError: rank 2 closed its communicator")
    assert "rank 2 raised TimeoutError: op 3 timed out" in text
    assert exc.value.__cause__ is results[0]
    assert raise_first([1, 2]) == [1, 2]
