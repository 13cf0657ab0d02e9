import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 262144, 'r0_': 4096},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*bf16', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused_bitwise_not_exp_logsumexp_masked_fill_mul_nan_to_num_sub_unsqueeze_view_0', 'mutated_arg_names': ['in_out_ptr0'], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 3, 'num_store': 1, 'num_reduction': 2, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': True, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'coordinate_descent_tuning': True, 'coordinate_descent_search_radius': 1, 'coordinate_descent_check_all_directions': False, 'add_persistent_rblock': True, 'tiling_scores': {'x': 0, 'r0_': 6442450944}}
)
@triton.jit
def triton_red_fused_bitwise_not_exp_logsumexp_masked_fill_mul_nan_to_num_sub_unsqueeze_view_0(in_out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 262144
    r0_numel = 4096
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp8 = tl.full([XBLOCK, R0_BLOCK], float("-inf"), tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_out_ptr0 + (r0_1 + 4096*x0), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp1 = tl.full([1, 1], 0.08838834764831843, tl.float32)
        tmp2 = tmp0 * tmp1
        tmp3 = tl.full([1, 1], False, tl.int1)
        tmp4 = tl.full([1, 1], float("-inf"), tl.float32)
        tmp5 = tl.where(tmp3, tmp4, tmp2)
        tmp6 = tmp5.to(tl.float32)
        tmp7 = tl.broadcast_to(tmp6, [XBLOCK, R0_BLOCK])
        tmp9 = triton_helpers.maximum(_tmp8, tmp7)
        _tmp8 = tl.where(r0_mask, tmp9, _tmp8)
    tmp8 = triton_helpers.max2(_tmp8, 1)[:, None]
    _tmp25 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp10 = tl.load(in_out_ptr0 + (r0_1 + 4096*x0), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp11 = tl.full([1, 1], 0.08838834764831843, tl.float32)
        tmp12 = tmp10 * tmp11
        tmp13 = tl.full([1, 1], False, tl.int1)
        tmp14 = tl.full([1, 1], float("-inf"), tl.float32)
        tmp15 = tl.where(tmp13, tmp14, tmp12)
        tmp16 = tmp15.to(tl.float32)
        tmp17 = tl_math.abs(tmp8)
        tmp18 = tl.full([1, 1], float("inf"), tl.float32)
        tmp19 = tmp17 == tmp18
        tmp20 = tl.full([1, 1], 0.0, tl.float32)
        tmp21 = tl.where(tmp19, tmp20, tmp8)
        tmp22 = tmp16 - tmp21
        tmp23 = libdevice.exp(tmp22)
        tmp24 = tl.broadcast_to(tmp23, [XBLOCK, R0_BLOCK])
        tmp26 = _tmp25 + tmp24
        _tmp25 = tl.where(r0_mask, tmp26, _tmp25)
    tmp25 = tl.sum(_tmp25, 1)[:, None]
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp27 = tl.load(in_out_ptr0 + (r0_1 + 4096*x0), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp28 = tl.full([1, 1], 0.08838834764831843, tl.float32)
        tmp29 = tmp27 * tmp28
        tmp30 = tl.full([1, 1], False, tl.int1)
        tmp31 = tl.full([1, 1], float("-inf"), tl.float32)
        tmp32 = tl.where(tmp30, tmp31, tmp29)
        tmp33 = tl_math.log(tmp25)
        tmp34 = tl_math.abs(tmp8)
        tmp35 = tl.full([1, 1], float("inf"), tl.float32)
        tmp36 = tmp34 == tmp35
        tmp37 = tl.full([1, 1], 0.0, tl.float32)
        tmp38 = tl.where(tmp36, tmp37, tmp8)
        tmp39 = tmp33 + tmp38
        tmp40 = tmp39.to(tl.float32)
        tmp41 = tmp32 - tmp40
        tmp42 = libdevice.exp(tmp41)
        tmp43 = tmp42.to(tl.float32)
        tmp44 = tmp43 == tmp35
        tmp45 = tmp43 == tmp31
        tmp46 = libdevice.isnan(tmp42).to(tl.int1)
        tmp47 = tl.where(tmp46, tmp37, tmp42)
        tmp48 = tl.full([1, 1], -3.3895313892515355e+38, tl.float32)
        tmp49 = tl.where(tmp45, tmp48, tmp47)
        tmp50 = tl.full([1, 1], 3.3895313892515355e+38, tl.float32)
        tmp51 = tl.where(tmp44, tmp50, tmp49)
        tl.store(in_out_ptr0 + (r0_1 + 4096*x0), tmp51, r0_mask)
