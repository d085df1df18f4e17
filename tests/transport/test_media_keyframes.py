"""KeyframeRequests (transport/media/keyframes.py): at most one grant per interval, on the caller's clock."""

from __future__ import annotations

import pytest

from worldcast.transport.media.keyframes import KeyframeRequests


def test_requests_are_granted_at_most_once_per_interval() -> None:
    r = KeyframeRequests(min_interval_s=1.0)
    assert [r.ask(t) for t in (5.0, 5.2, 5.99, 6.0, 6.5, 7.1)] == [True, False, False, True, False, True]
    assert (r.granted, r.refused) == (3, 3)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="min_interval_s"):
            KeyframeRequests(min_interval_s=bad)
