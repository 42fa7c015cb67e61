"""The gateway launcher's core split (sglang_specsot/gateway.py)."""

from __future__ import annotations

import pytest

from sglang_specsot.gateway import core_sets


@pytest.mark.parametrize("replicas, cores, sets", [
    (1, 2, ["0-1"]), (2, 2, ["0", "1"]), (2, 8, ["0-3", "4-7"]), (3, 8, ["0-2", "3-5", "6-7"]),
])  # fmt: skip
def test_each_replica_gets_its_own_contiguous_cores(replicas, cores, sets):
    assert core_sets(replicas, cores) == sets


@pytest.mark.parametrize("replicas", [0, 3])
def test_more_replicas_than_cores_is_refused_with_the_range(replicas):
    with pytest.raises(ValueError, match=rf"replicas={replicas}: .* has 2; use 1 to 2 replicas"):
        core_sets(replicas, 2)
