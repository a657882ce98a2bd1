"""Occupancy arithmetic against hand-computed cases (Hopper limits)."""

import dataclasses

import pytest

from opforge.profile import Limits, theoretical_occupancy


def test_register_limited():
    # 128 regs x 32 threads = 4096 regs a warp; 65536 / 4096 = 16 warps = 2 blocks of 8
    o = theoretical_occupancy(128, 0, 8)
    assert (o.blocks_per_sm, o.active_warps, o.limiter) == (2, 16, "registers")
    assert o.occupancy == pytest.approx(0.25)
    assert o.limits["registers"] == 2 and o.limits["warps"] == 8


def test_register_rounding_to_allocation_unit():
    # 33 regs: 1056 a warp -> rounded to 1280; 65536 // 1280 = 51 warps -> 12 blocks of 4
    o = theoretical_occupancy(33, 0, 4)
    assert o.limits["registers"] == 12 and o.limiter == "registers"
    # 40 regs: exactly 1280 a warp, same count
    assert theoretical_occupancy(40, 0, 4).limits["registers"] == 12
    # 48 regs, 8 warps: 1536 a warp -> 42 warps -> 5 blocks
    assert theoretical_occupancy(48, 128, 8).blocks_per_sm == 5


def test_shared_memory_limited():
    # 160 KB + 1 KB reserved: one block fits in 228 KB
    o = theoretical_occupancy(32, 160 * 1024, 4)
    assert (o.blocks_per_sm, o.limiter) == (1, "shared memory")
    assert o.occupancy == pytest.approx(4 / 64)


def test_shared_memory_rounding_and_reserve():
    # 100 bytes -> 128 + 1024 = 1152 a block; 233472 // 1152 = 202
    assert theoretical_occupancy(16, 100, 1).limits["shared memory"] == 202
    # 56 KB: 57344 + 1024 = 58368 -> 4 blocks; 57 KB: 59392 -> 3 blocks
    assert theoretical_occupancy(16, 56 * 1024, 1).limits["shared memory"] == 4
    assert theoretical_occupancy(16, 57 * 1024, 1).limits["shared memory"] == 3
    assert theoretical_occupancy(16, 0, 1).limits["shared memory"] == 228


def test_warp_limited():
    # 4 warps x 32 regs: registers allow 16 blocks, warps allow 64 / 4 = 16; warps named on a tie
    o = theoretical_occupancy(32, 0, 4)
    assert (o.blocks_per_sm, o.active_warps, o.limiter) == (16, 64, "warps")
    assert o.occupancy == 1.0


def test_block_limited():
    o = theoretical_occupancy(16, 256, 1)
    assert (o.blocks_per_sm, o.active_warps, o.limiter) == (32, 32, "blocks")
    assert o.occupancy == 0.5


def test_zero_registers_means_no_register_limit():
    assert theoretical_occupancy(0, 0, 2).limiter == "warps"


def test_custom_limits():
    lim = dataclasses.replace(Limits(), max_warps_per_sm=48, shared_per_sm=100 * 1024)
    o = theoretical_occupancy(32, 0, 4, lim)
    assert (o.blocks_per_sm, o.occupancy) == (12, 1.0)


@pytest.mark.parametrize("regs, smem, warps, err", [
    (256, 0, 4, ValueError),          # over 255 registers a thread
    (-1, 0, 4, ValueError),
    (32, -5, 4, ValueError),
    (32, 228 * 1024, 4, ValueError),  # over the 227 KB a block may have
    (32, 0, 0, ValueError),
    (32, 0, 33, ValueError),          # over 1024 threads a block
    (255, 0, 32, ValueError),         # 255 regs x 1024 threads exceed the register file
    (32.5, 0, 4, TypeError),
    ("32", 0, 4, TypeError),
    (32, 0, True, TypeError),
])
def test_nonsense_input(regs, smem, warps, err):
    with pytest.raises(err):
        theoretical_occupancy(regs, smem, warps)


def test_str_and_dict():
    o = theoretical_occupancy(128, 0, 8)
    assert "registers" in str(o) and o.to_dict()["blocks_per_sm"] == 2


def test_from_device_without_cuda():
    import torch

    if torch.cuda.is_available():
        lim = Limits.from_device(0)
        assert lim.registers_per_sm > 0 and lim.max_warps_per_sm > 0
    else:
        with pytest.raises(RuntimeError, match="CUDA"):
            Limits.from_device()
