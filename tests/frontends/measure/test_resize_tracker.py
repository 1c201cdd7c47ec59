"""`frontends.measure.resize_tracker`: storages grown and shrunk in place count, as FSDP2's do."""

from __future__ import annotations

import pytest
import torch

from frontends.measure.memory_tracker import track_live_memory
from frontends.measure.resize_tracker import track_live_memory_with_resizes


def _emptied(n_floats: int) -> torch.Tensor:
    """A tensor whose storage was freed in place, as FSDP2 leaves a resharded parameter."""
    t = torch.empty(n_floats, dtype=torch.float32)
    t.untyped_storage().resize_(0)
    return t


def test_a_storage_grown_in_place_counts_until_it_is_shrunk():
    param = _emptied(1000)
    with track_live_memory_with_resizes() as tracker:
        param.untyped_storage().resize_(4000)   # the all-gather's unsharded parameter
        activation = param * 2                   # 4000 more, through the dispatcher
        assert tracker.ledger.settle() == 8000
        param.untyped_storage().resize_(0)       # resharded
        del activation
    assert tracker.peak_bytes == 8000
    assert tracker.result.final_live_bytes == 0


def test_the_dispatch_tracker_alone_misses_it():
    param = _emptied(1000)
    with track_live_memory() as tracker:
        param.untyped_storage().resize_(4000)
    assert tracker.result.peak_bytes == 0  # why FSDP2 needs the resize-aware tracker
    param.untyped_storage().resize_(0)


def test_resize_is_restored_and_one_measurement_at_a_time():
    original = torch.UntypedStorage.resize_
    with track_live_memory_with_resizes():
        assert torch.UntypedStorage.resize_ is not original
        with pytest.raises(RuntimeError, match="another resize-aware measurement"), \
                track_live_memory_with_resizes():
            pass
    assert torch.UntypedStorage.resize_ is original
