"""lab.ops.attention_varlen with block_table on a GPU of compute capability 9.0 (fwd v11's paged loads): every case
of lab.masks.gpu_paged against float64 (shuffled tables, NaN in every cache row no sequence owns, poisoned outputs),
the build that ignores the table failing, and bad tables zeroed and flagged. Skipped without such a GPU."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="needs a CUDA GPU of compute capability 9.0")


@pytest.fixture(scope="module")
def gpu_paged():
    from lab.masks import gpu_paged
    return gpu_paged


@pytest.mark.parametrize("index", range(6))
def test_paged_case(gpu_paged, index):
    assert gpu_paged.check_case(*gpu_paged.CASES[index])


def test_table_ignored_fails(gpu_paged):
    assert gpu_paged.check_case(*gpu_paged.CASES[0], defines={"LAB_FWD_MASK_BUG_IGNORE_TABLE": 1}, expect_fail=True)


def test_bad_tables(gpu_paged):
    assert gpu_paged.check_bad_tables()
