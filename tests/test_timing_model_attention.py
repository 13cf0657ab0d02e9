"""bench/timing_model_attention.py's work counts: the key blocks each query tile visits, the ones a mask touches,
and the MUFU work the sm100 variant's exp2 emulation (EXP2_EMU) takes off (no fit here: the counts the fit and the
sm100 prediction rest on)."""
from __future__ import annotations

import pytest

from bench import timing_model_attention as tm

CFG = {"BLOCK_M": 128, "BLOCK_N": 128}


def _case(lq, lk, mod, d=128):
    return {"B": 1, "Hq": 8, "Hkv": 8, "Lq": lq, "Lk": lk, "D": d, "mod": mod}


def test_key_blocks_follow_the_mask():
    blocks, _ = tm.key_blocks(_case(1024, 1024, "none"), 128, 128)
    assert blocks.tolist() == [8] * 8
    blocks, _ = tm.key_blocks(_case(1024, 1024, "causal"), 128, 128)
    assert blocks.tolist() == list(range(1, 9))           # tile i sees keys up to its last row
    blocks, _ = tm.key_blocks(_case(1, 4096, "causal"), 128, 128)
    assert blocks.tolist() == [32]                         # bottom-right: a decode query sees the whole cache


@pytest.mark.parametrize("lq, lk, mod, tile_m, masked", [
    (1024, 1024, "none", 128, 0), (1000, 1000, "none", 128, 1),   # a ragged tail is the one masked block
    (1024, 1024, "causal", 128, 1), (1024, 1024, "causal", 256, 2),   # the diagonal: one block per 128 rows
    (1000, 1024, "causal", 128, 2),                                 # offset Lk - Lq off the block grid: two
    (4096, 4096, "window", 128, 2),                                 # the window's left edge besides
])
def test_masked_blocks(lq, lk, mod, tile_m, masked):
    assert tm.masked_blocks(_case(lq, lk, mod), tile_m, 128) == masked


def test_exp2_emulation_takes_its_share_of_mufu_work_off_unmasked_blocks_only():
    long = _case(8192, 8192, "none")
    base = tm.features(long, CFG, tm.B200)["mufu_ops"]
    emu = tm.features(long, {**CFG, "EXP2_EMU": 1, "S_CHUNK": 32}, tm.B200)["mufu_ops"]
    assert base == 128 * 128 and emu == pytest.approx(base * 0.75)   # one of four chunks, every block unmasked
    short = _case(128, 128, "causal")                                  # its only block is the diagonal: no change
    assert tm.features(short, {**CFG, "EXP2_EMU": 1}, tm.B200)["mufu_ops"] == base
    softcap = tm.features(long, {**CFG, "EXP2_EMU": 1}, tm.B200)["mufu_ops"]
    assert tm.features(_case(8192, 8192, "softcap"), {**CFG, "EXP2_EMU": 1}, tm.B200)["mufu_ops"] == softcap + base


def test_less_mufu_work_never_predicts_a_slower_kernel():
    params = dict(zip(tm.PARAMS, tm.START))
    for mod in ("none", "causal", "softcap"):
        case = _case(4096, 4096, mod)
        slow = tm.time_us(params, tm.features(case, CFG, tm.B200))[0]
        fast = tm.time_us(params, tm.features(case, {**CFG, "EXP2_EMU": 1}, tm.B200))[0]
        assert fast <= slow
