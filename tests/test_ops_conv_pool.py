"""Convolution and pooling operators of the engine (ops/conv.c, ops/pool.c)
against torch.nn.functional: forward values and the gradients of X, W and B
(all graph inputs of the one-node model), float32 and float64.

ONNX's asymmetric pads have no torch argument: the references pad with F.pad
(or crop, for ConvTranspose) and run the unpadded torch operator.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import aidge_interop
from op_harness import check_op, check_wrapped_step, make_model

DTYPES = [np.float32, np.float64]
dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)


def _x(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _torch_pad(pads):
    """ONNX pads (begin..., end...) as F.pad's (last dim first) list."""
    nsp = len(pads) // 2
    out = []
    for d in reversed(range(nsp)):
        out += [pads[d], pads[nsp + d]]
    return out


def _same_pads(in_sizes, kernel, strides, dilations, upper):
    """ONNX auto_pad SAME_*: output ceil(in / stride)."""
    begin, end = [], []
    for i, k, s, d in zip(in_sizes, kernel, strides, dilations):
        total = max(0, (-(-i // s) - 1) * s + (k - 1) * d + 1 - i)
        b = total // 2 if upper else total - total // 2
        begin.append(b)
        end.append(total - b)
    return begin + end


CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
MAXP = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVGP = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}

# ---------------------------------------------------------------- Conv

# (N, C, M, spatial, kernel, strides, dilations, pads, group, bias)
CONV_CASES = {
    "1d": (2, 3, 4, (9,), (3,), (1,), (1,), (1, 1), 1, True),
    "1d_stride_dil_asym": (3, 2, 5, (11,), (3,), (2,), (2,), (2, 0), 1, True),
    "2d_3x3_pad1": (2, 3, 8, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True),
    "2d_nonsquare": (1, 3, 4, (7, 9), (2, 3), (1, 2), (1, 1), None, 1, False),
    "2d_stride_dilation": (3, 4, 6, (11, 10), (3, 2), (2, 3), (2, 1), (1, 0, 1, 0), 1, True),
    "2d_asym_pads": (2, 3, 4, (7, 6), (3, 3), (2, 1), (1, 1), (0, 2, 1, 1), 1, True),
    "2d_groups": (2, 6, 9, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 3, True),
    "2d_depthwise": (3, 5, 5, (6, 5), (3, 3), (2, 1), (1, 2), (1, 2, 1, 2), 5, False),
    "2d_depthwise_mult": (2, 4, 8, (5, 5), (3, 1), (1, 1), (1, 1), (1, 0, 1, 0), 4, True),
    # >= 8 channels, narrow: the channels-last depthwise kernel; wide: plane by plane
    "2d_depthwise_chlast": (2, 8, 8, (9, 7), (3, 3), (2, 1), (1, 2), (1, 0, 2, 1), 8, True),
    # channels-last forward on zero-padded x: 20 channels (a block of 16 and one of 4),
    # 24 (16 + 8), a stride leaving the last input column unread
    "2d_depthwise_chlast_c20_s2": (2, 20, 20, (10, 9), (3, 3), (2, 2), (1, 1), (1, 1, 0, 0),
                                   20, True),
    "2d_depthwise_chlast_c24_dil": (3, 24, 24, (7, 6), (3, 2), (1, 1), (2, 3), (2, 1, 2, 2),
                                    24, False),
    "2d_depthwise_wide": (2, 3, 3, (5, 40), (3, 3), (1, 2), (1, 1), (1, 1, 1, 1), 3, True),
    # small output planes (<= 16, or <= 36 strided), >= 8 channels: channels-last in
    # every pass (MobileNet's last blocks); 40 channels: 2 blocks of 16 and one of 8
    "2d_depthwise_small_3x3": (3, 40, 40, (3, 3), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 40,
                               True),
    "2d_depthwise_small_s2": (2, 24, 24, (12, 11), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 24,
                              False),
    "1d_depthwise_chlast": (2, 16, 16, (10,), (3,), (1,), (1,), (1, 1), 16, True),
    # depthwise through zero-padded stride-phase planes (forward; input gradient at
    # stride 1): rows longer than one 16-lane chunk, pads above (k - 1) d, more
    # planes than slots, a channel multiplier with stride 2, 5x5 stride 2
    # float32, stride 1, one group, k > 1: the direct register-tiled kernel (forward, and
    # the input gradient while pads <= (k - 1) d): few channels, M not a multiple of 4,
    # grids not a multiple of the 24-position block, dilation, pads above the span
    "2d_direct_c1_m6_5x5": (3, 1, 6, (12, 11), (5, 5), (1, 1), (1, 1), None, 1, True),
    "2d_direct_pads_over_span": (2, 3, 5, (7, 6), (2, 3), (1, 1), (1, 1), (2, 1, 1, 3), 1,
                                 True),
    "2d_direct_wide_dil": (2, 5, 9, (9, 29), (3, 3), (1, 1), (2, 1), (2, 1, 2, 1), 1, True),
    "1d_direct_dil": (2, 4, 7, (30,), (3,), (1,), (3,), (3, 2), 1, False),
    # a grid of >= 256 positions: the direct weight gradient too (4 taps: groups of 3 and 1)
    "2d_direct_dw_2x2": (2, 3, 6, (20, 18), (2, 2), (1, 1), (1, 1), (1, 0, 0, 1), 1, True),
    # fewer than 8 input channels: the weight gradient over chunks of images (sums
    # across lanes once per chunk): 4 + 1 images; LeNet's 6 -> 16 5x5 (25 taps)
    "2d_direct_dw_chunks": (5, 2, 5, (20, 14), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True),
    "2d_direct_dw_lenet": (4, 6, 16, (14, 14), (5, 5), (1, 1), (1, 1), None, 1, True),
    # strided: the same kernel on stride-phase planes; with grids of >= 256 positions the
    # weight gradient too (MobileNet's first conv; asymmetric strides with dilation; 1d)
    "2d_direct_dw_s2": (3, 3, 8, (40, 38), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, True),
    "2d_direct_dw_s23_dil": (2, 4, 6, (45, 50), (3, 2), (2, 3), (2, 1), (1, 0, 2, 1), 1,
                             True),
    "1d_direct_dw_s3": (2, 3, 5, (700,), (5,), (3,), (1,), (2, 1), 1, False),
    "2d_direct_s2_3x3": (2, 3, 5, (11, 12), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, True),
    "2d_direct_10x4_s2": (2, 1, 6, (20, 9), (10, 4), (2, 2), (1, 1), (4, 1, 5, 2), 1, True),
    "2d_direct_s23_dil": (1, 4, 9, (13, 17), (3, 2), (2, 3), (2, 3), (0, 2, 1, 0), 1, False),
    "1d_direct_s3": (3, 2, 4, (26,), (5,), (3,), (1,), (2, 2), 1, True),
    "2d_depthwise_pad_long_rows": (3, 16, 16, (5, 37), (3, 3), (1, 1), (2, 1),
                                   (2, 1, 0, 3), 16, True),
    "2d_depthwise_pad_big_pads": (2, 3, 3, (4, 6), (2, 3), (1, 1), (1, 1), (3, 2, 1, 4), 3,
                                  True),
    "2d_depthwise_pad_s2_mult": (2, 4, 8, (11, 9), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 4,
                                 False),
    "2d_depthwise_pad_5x5_s2": (2, 6, 6, (13, 12), (5, 5), (2, 3), (1, 1), (2, 2, 2, 2), 6,
                                True),
    "1d_depthwise_pad_s3_dil": (2, 5, 5, (23,), (4,), (3,), (2,), (3, 1), 5, True),
    # narrow planes (< 16 wide). Stride 1 with the output as wide as the input: flat runs
    # over copies of the plane whose wrapped edge columns are zeros (KWS's 25x5; a
    # channel multiplier with pads all on the right; one column). Strided: flat runs of
    # the phase planes' rows
    "2d_depthwise_same_kws": (2, 8, 8, (25, 5), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 8, True),
    "2d_depthwise_same_mult_asym": (2, 3, 6, (9, 4), (3, 3), (1, 1), (1, 1), (1, 0, 1, 2), 3,
                                    True),
    "2d_depthwise_same_w1": (2, 4, 4, (6, 1), (3, 1), (1, 1), (1, 1), (1, 0, 1, 0), 4, False),
    "2d_depthwise_narrow_s2": (2, 8, 8, (12, 12), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 8,
                               True),
    # float32 with AVX-512: the forward and (planes of 64 positions or more) the input
    # gradient straight on the planes, 16 positions a vector (depthwise_narrow in conv_depthwise.c): 9, 5 and
    # 6 chunks of 16 (blocks of 8, 4, 2 and 1), dilated rows and asymmetric pads that
    # keep the width, fewer output rows than input rows, 1-D
    "2d_depthwise_narrow_12x12": (3, 10, 10, (12, 12), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 10,
                               True),
    "2d_depthwise_narrow_11x7": (2, 6, 6, (11, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 6,
                              False),
    "2d_depthwise_narrow_dil_asym": (2, 9, 9, (14, 6), (3, 5), (1, 1), (2, 1), (2, 1, 2, 3), 9,
                                  True),
    "2d_depthwise_narrow_fewer_rows": (2, 8, 8, (20, 6), (3, 3), (1, 1), (1, 1), (0, 1, 0, 1), 8,
                                    True),
    "1d_depthwise_narrow": (3, 8, 8, (13,), (5,), (1,), (1,), (2, 2), 8, True),
    # forward channels-last by units of 8 channels (depthwise_channels_last in conv_depthwise.c): a partial
    # unit, taps past the image (last row or column unused: the row by row fill),
    # dilation, 1-D, more jobs than slots
    "2d_depthwise_channels_last_c17_s2": (3, 17, 17, (10, 9), (3, 3), (2, 2), (1, 1), (1, 1, 0, 0), 17,
                                True),
    "2d_depthwise_channels_last_5x3_dil": (2, 12, 12, (9, 8), (5, 3), (1, 1), (2, 1), (4, 1, 3, 1), 12,
                                 True),
    "1d_depthwise_channels_last_s2": (2, 9, 9, (31,), (5,), (2,), (1,), (2, 2), 9, True),
    "2d_depthwise_channels_last_slots": (5, 64, 64, (6, 6), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 64,
                               False),
    # stride 2, 32x32 outputs: the backward's weight-gradient sums in 4 blocks of rows
    "2d_depthwise_channels_last_s2_blocks": (2, 16, 16, (64, 63), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1),
                                   16, True),
    # wide, stride 1, same width: the weight gradient on the edge-zeroed copies too
    "2d_depthwise_same_wide_dw": (2, 8, 16, (20, 40), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 8,
                                  True),
    "3d_depthwise_chlast": (1, 8, 8, (4, 5, 6), (2, 3, 3), (1, 2, 1), (1, 1, 1),
                            (0, 1, 1, 1, 0, 1), 8, False),
    # >= 16 channels out, strided or rows under 16 wide: channels-last tiles
    # (blocked_forward, conv_blocked.c): stems of 1 to 4 channels, 16, 24 and 32+ output channels
    # per tile, a partial vector (20, 41), asymmetric pads, dilation, 1-D, more
    # jobs than slots, many taps (16 and 40 channels in, strided or narrow), 1x1
    # kernels strided or padded
    "2d_stem_kws": (3, 1, 64, (29, 12), (10, 4), (2, 2), (1, 1), (4, 1, 5, 1), 1, True),
    "2d_stem_s2_41": (2, 3, 41, (19, 18), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, True),
    "2d_stem_narrow_20_dil": (2, 4, 20, (9, 7), (3, 2), (1, 1), (2, 1), (2, 0, 1, 1), 1,
                              False),
    "2d_stem_s21_24": (2, 2, 24, (12, 30), (2, 3), (2, 1), (1, 1), (0, 1, 1, 0), 1, True),
    "1d_stem_s2_16": (3, 3, 16, (40,), (5,), (2,), (1,), (2, 2), 1, True),
    "2d_stem_slots": (9, 1, 16, (40, 30), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, True),
    "2d_blocked_16_s2": (3, 16, 32, (17, 16), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, True),
    "2d_blocked_40_narrow": (2, 40, 17, (9, 10), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, False),
    "2d_blocked_1x1_s2": (2, 16, 32, (9, 8), (1, 1), (2, 2), (1, 1), None, 1, True),
    "2d_blocked_1x1_pad_narrow": (2, 8, 16, (5, 6), (1, 1), (1, 1), (1, 1), (0, 1, 1, 0), 1, False),
    # pads past the kernel: the first and last output rows read only padding
    # (the tiles skip the kernel rows that read none of the image)
    "2d_blocked_rows_all_padding": (2, 3, 16, (6, 9), (3, 3), (2, 1), (1, 1), (4, 1, 5, 1), 1, True),
    "2d_blocked_rows_dil_asym": (2, 5, 24, (11, 7), (3, 3), (1, 1), (3, 1), (4, 1, 2, 1), 1, True),
    # 3x3, pads 1, rows of 8 and 32 output channels: with 16-lane tiles, tiles of
    # whole rows (their first and last rows skip a kernel row)
    "2d_blocked_row_tiles_edges": (2, 8, 32, (6, 8), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True),
    "2d_pointwise": (2, 6, 4, (5, 3), (1, 1), (1, 1), (1, 1), None, 2, True),
    # planes of <= 64 positions: the batch in one GEMM (forward, dw, dx)
    "2d_pointwise_batched": (5, 12, 20, (3, 3), (1, 1), (1, 1), (1, 1), None, 1, True),
    # float32 forward by the direct pointwise kernel (pointwise_direct_forward, conv_pointwise.c): planes over 64
    # positions image by image, a last block shorter than 16 and a last channel tile
    # shorter than 6 (99 positions, 13 channels; 1-D); planes of 16 (every block
    # inside one image, read in place)
    "2d_pointwise_direct_tail": (2, 7, 13, (11, 9), (1, 1), (1, 1), (1, 1), None, 1, True),
    "1d_pointwise_direct": (3, 5, 8, (70,), (1,), (1,), (1,), None, 1, False),
    "2d_pointwise_direct_16": (3, 9, 6, (4, 4), (1, 1), (1, 1), (1, 1), None, 1, True),
    # small planes over 64 positions: the backward's weight gradient by panels summed
    # over the images, its input gradient image by image (pointwise_small_images in conv_pointwise.c); KWS's 25x5
    "2d_pointwise_small_kws": (3, 16, 12, (25, 5), (1, 1), (1, 1), (1, 1), None, 1, True),
    "2d_strided_1x1": (1, 3, 2, (7, 7), (1, 1), (2, 2), (1, 1), None, 1, True),
    # strided 1x1 kernels without padding: im2col's subsampling loop (1-D, 2-D with
    # unequal strides and groups, 3-D, a dilation that changes nothing); with padding
    # the general loop
    "1d_strided_1x1": (2, 3, 4, (10,), (1,), (3,), (1,), None, 1, True),
    "2d_strided_1x1_groups": (2, 4, 6, (9, 8), (1, 1), (3, 2), (2, 2), None, 2, False),
    "3d_strided_1x1": (2, 3, 5, (5, 6, 7), (1, 1, 1), (2, 3, 2), (1, 1, 1), None, 1, True),
    "2d_strided_1x1_pad": (2, 3, 4, (6, 7), (1, 1), (2, 2), (1, 1), (1, 0, 0, 1), 1, True),
    # pads at the end only: the last outputs read padding (the general loop)
    "2d_1x1_end_pads": (2, 3, 4, (5, 6), (1, 1), (1, 1), (1, 1), (0, 0, 1, 2), 1, True),
    "1d_strided_1x1_end_pad": (2, 3, 2, (7,), (1,), (2,), (1,), (0, 2), 1, False),
    "3d": (2, 2, 3, (5, 6, 4), (3, 2, 3), (1, 2, 1), (1, 1, 1), (1, 0, 1, 1, 1, 1), 1, True),
    "3d_groups_dil": (1, 4, 6, (7, 5, 6), (2, 2, 2), (2, 1, 1), (2, 1, 2), None, 2, False),
    # stride 1, >= 8 channels per group: one GEMM per kernel tap on padded planes
    "2d_shifted_3x3": (3, 16, 12, (9, 10), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True),
    "2d_shifted_groups_dil_asym": (2, 16, 10, (20, 18), (3, 2), (1, 1), (2, 1), (2, 0, 1, 1),
                                   2, True),
    "2d_shifted_unpadded_5x5": (2, 8, 6, (28, 28), (5, 5), (1, 1), (1, 1), None, 1, False),
    "1d_shifted": (4, 8, 5, (60,), (5,), (1,), (2,), (3, 1), 1, False),
    # strided, >= 8 channels per group: im2col (the shifted form is stride-1 only)
    "2d_shifted_stride2_3x3": (3, 16, 12, (17, 16), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, True),
    "2d_shifted_stride2_1x1": (2, 8, 6, (15, 16), (1, 1), (2, 2), (1, 1), None, 1, True),
    "2d_shifted_stride21_dil_asym": (2, 16, 10, (21, 19), (3, 2), (2, 1), (2, 2), (2, 0, 1, 3),
                                     2, False),
    "1d_shifted_stride3": (3, 8, 5, (61,), (4,), (3,), (1,), (2, 1), 1, True),
    # large enough planes that the batch goes through in chunks (3 images, then 1)
    "2d_shifted_chunks": (4, 16, 16, (128, 128), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True),
}


def _conv_ref(nsp, strides, dilations, pads, group):
    def fn(x, w, b=None):
        if pads is not None and list(pads[:nsp]) == list(pads[nsp:]):
            return CONV[nsp](x, w, b, strides, pads[:nsp], dilations, group)
        xp = F.pad(x, _torch_pad(pads)) if pads is not None else x
        return CONV[nsp](xp, w, b, strides, 0, dilations, group)
    return fn


@dtypes
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv(case, dtype):
    N, C, M, sp, k, s, d, pads, group, bias = CONV_CASES[case]
    nsp = len(sp)
    inputs = {"x": _x((N, C, *sp), dtype, 1), "w": _x((M, C // group, *k), dtype, 2)}
    if bias:
        inputs["b"] = _x((M,), dtype, 3)
    attrs = {"strides": list(s), "dilations": list(d), "group": group}
    if pads is not None:
        attrs["pads"] = list(pads)
    if case.endswith("nonsquare"):
        attrs["kernel_shape"] = list(k)
    check_op("Conv", inputs, _conv_ref(nsp, s, d, pads, group), attrs=attrs)


@dtypes
@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("sp,k,s,d", [((7, 8), (3, 2), (1, 1), (1, 1)),
                                      ((9, 6), (4, 3), (2, 3), (1, 2)),
                                      ((10,), (5,), (3,), (2,)),
                                      ((5, 4, 6), (2, 3, 3), (2, 1, 2), (1, 1, 1))], ids=str)
def test_conv_auto_pad(sp, k, s, d, mode, dtype):
    nsp = len(sp)
    x, w, b = _x((2, 3, *sp), dtype, 1), _x((4, 3, *k), dtype, 2), _x((4,), dtype, 3)
    pads = [0] * 2 * nsp if mode == "VALID" else _same_pads(sp, k, s, d, mode == "SAME_UPPER")
    (y,) = check_op("Conv", {"x": x, "w": w, "b": b}, _conv_ref(nsp, s, d, pads, 1),
                    attrs={"auto_pad": mode, "strides": list(s), "dilations": list(d)})
    if mode != "VALID":
        assert list(y.shape[2:]) == [-(-i // st) for i, st in zip(sp, s)]


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("sp,k", [((7, 8), (3, 2)), ((6,), (4,))], ids=str)
def test_conv_same_upper_is_torch_same(sp, k):
    # an independent reference: torch's padding="same" puts the odd pad at the end
    x, w = _x((2, 3, *sp), np.float64, 1), _x((5, 3, *k), np.float64, 2)
    check_op("Conv", {"x": x, "w": w}, lambda x, w: CONV[len(sp)](x, w, padding="same"),
             attrs={"auto_pad": "SAME_UPPER"})


def test_conv_constant_weight_and_constant_input():
    # din[] NULL for the inputs that need no gradient
    x, w, b = _x((2, 3, 6, 5), np.float64, 1), _x((4, 3, 3, 3), np.float64, 2), _x((4,), np.float64, 3)
    ref = lambda x, w, b: F.conv2d(x, w, b, padding=1)
    check_op("Conv", {"x": x}, ref, consts={"w": w, "b": b}, attrs={"pads": [1, 1, 1, 1]})
    check_op("Conv", {"w": w, "b": b}, lambda w, b, x: ref(x, w, b), consts={"x": x},
             attrs={"pads": [1, 1, 1, 1]}, input_order=["x", "w", "b"])


@dtypes
@pytest.mark.parametrize("case", [c for c in CONV_CASES if "direct" in c])
def test_conv_weight_gradient_alone(case, dtype):
    # X a constant (a model's first layer): the weight gradient without the input's,
    # which float32 takes through the direct kernel when the grid is large enough,
    # strided ones included
    N, C, M, sp, k, s, d, pads, group, bias = CONV_CASES[case]
    nsp = len(sp)
    x = _x((N, C, *sp), dtype, 1)
    inputs = {"w": _x((M, C // group, *k), dtype, 2)}
    if bias:
        inputs["b"] = _x((M,), dtype, 3)
    attrs = {"strides": list(s), "dilations": list(d), "group": group}
    if pads is not None:
        attrs["pads"] = list(pads)
    ref = _conv_ref(nsp, s, d, pads, group)
    check_op("Conv", inputs, lambda *a: ref(a[-1], *a[:-1]), consts={"x": x}, attrs=attrs,
             input_order=["x", *inputs])


# ---------------------------------------------------------------- ConvTranspose

# (N, C, M, spatial, kernel, strides, dilations, pads, output_padding, group, bias)
CONVT_CASES = {
    "1d": (2, 3, 4, (6,), (3,), (2,), (1,), (1, 1), (1,), 1, True),
    "2d": (2, 4, 3, (5, 4), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), (0, 0), 1, True),
    "2d_stride_outpad": (3, 3, 5, (4, 5), (3, 2), (2, 3), (1, 1), (1, 0, 1, 0), (1, 2), 1, True),
    "2d_dilation": (1, 2, 3, (5, 5), (3, 3), (2, 2), (2, 1), (2, 1, 2, 1), (1, 0), 1, False),
    "2d_groups": (2, 6, 4, (4, 5), (3, 3), (2, 1), (1, 1), (0, 1, 0, 1), (1, 0), 2, True),
    "2d_depthwise": (2, 4, 4, (5, 4), (2, 3), (2, 2), (1, 1), None, (0, 1), 4, True),
    "2d_asym_pads": (2, 3, 2, (5, 6), (3, 3), (2, 2), (1, 1), (0, 2, 1, 1), (1, 1), 1, True),
    "2d_pointwise": (2, 4, 6, (3, 5), (1, 1), (1, 1), (1, 1), None, (0, 0), 2, True),
    "3d": (2, 2, 3, (3, 4, 3), (2, 3, 2), (2, 1, 2), (1, 1, 1), (0, 1, 1, 0, 1, 0), (1, 0, 1), 1, True),
}


def _convt_ref(nsp, strides, dilations, pads, opad, group):
    def fn(x, w, b=None):
        if pads is None or list(pads[:nsp]) == list(pads[nsp:]):
            p = 0 if pads is None else pads[:nsp]
            return CONVT[nsp](x, w, b, strides, p, opad, group, dilations)
        y = CONVT[nsp](x, w, b, strides, 0, opad, group, dilations)
        for dim in range(nsp):
            y = y.narrow(2 + dim, pads[dim], y.shape[2 + dim] - pads[dim] - pads[nsp + dim])
        return y
    return fn


@dtypes
@pytest.mark.parametrize("case", list(CONVT_CASES))
def test_conv_transpose(case, dtype):
    N, C, M, sp, k, s, d, pads, opad, group, bias = CONVT_CASES[case]
    nsp = len(sp)
    inputs = {"x": _x((N, C, *sp), dtype, 1), "w": _x((C, M // group, *k), dtype, 2)}
    if bias:
        inputs["b"] = _x((M,), dtype, 3)
    attrs = {"strides": list(s), "dilations": list(d), "group": group,
             "output_padding": list(opad)}
    if pads is not None:
        attrs["pads"] = list(pads)
    check_op("ConvTranspose", inputs, _convt_ref(nsp, s, d, pads, opad, group), attrs=attrs)


def _convt_spec_pads(sp, k, s, d, opad, out_shape, upper):
    """ONNX ConvTranspose: pads from output_shape (SAME_UPPER: more at the end)."""
    begin, end = [], []
    for i, kk, ss, dd, op, o in zip(sp, k, s, d, opad, out_shape):
        total = ss * (i - 1) + op + (kk - 1) * dd + 1 - o
        b = total // 2 if upper else total - total // 2
        begin.append(b)
        end.append(total - b)
    return begin + end


@dtypes
@pytest.mark.parametrize("out_shape,mode", [
    ((9, 8), "NOTSET"), ((10, 10), "NOTSET"), ((9, 8), "SAME_UPPER"), ((10, 10), "SAME_LOWER"),
    (None, "SAME_UPPER"), (None, "SAME_LOWER")], ids=str)
def test_conv_transpose_output_shape_and_auto_pad(out_shape, mode, dtype):
    sp, k, s, d, opad = (5, 4), (3, 4), (2, 2), (1, 1), (1, 0)
    target = out_shape or tuple(i * st for i, st in zip(sp, s))
    pads = _convt_spec_pads(sp, k, s, d, opad, target, mode == "SAME_UPPER")
    x, w, b = _x((2, 3, *sp), dtype, 1), _x((3, 2, *k), dtype, 2), _x((2,), dtype, 3)
    attrs = {"strides": list(s), "output_padding": list(opad), "auto_pad": mode}
    if out_shape:
        attrs["output_shape"] = list(out_shape)
    (y,) = check_op("ConvTranspose", {"x": x, "w": w, "b": b},
                    _convt_ref(2, s, d, pads, opad, 1), attrs=attrs)
    assert tuple(y.shape[2:]) == target


@pytest.mark.parametrize("attrs", [
    {"output_shape": [10, 9], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"output_shape": [10, 9], "strides": [2, 2], "auto_pad": "SAME_LOWER",
     "output_padding": [1, 0]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 3]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 3]},
], ids=str)
def test_conv_transpose_matches_onnx_reference(attrs):
    # the pads ONNX derives from output_shape / auto_pad, per onnx.reference
    # (which ignores output_shape under auto_pad NOTSET)
    from onnx.reference import ReferenceEvaluator

    x, w, b = _x((1, 2, 5, 4), np.float64, 1), _x((2, 3, 3, 4), np.float64, 2), _x((3,), np.float64, 3)
    model = make_model("ConvTranspose", {"x": x, "w": w, "b": b}, attrs)
    (ref,) = ReferenceEvaluator(model).run(None, {"x": x, "w": w, "b": b})
    (y,) = aidge_interop.load_onnx(model).forward([x, w, b])
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-12)


def test_conv_transpose_full_output_shape():
    # output_shape given as (N, M, spatial...) means its spatial part
    x, w = _x((2, 3, 5, 4), np.float64, 1), _x((3, 2, 3, 3), np.float64, 2)
    ys = [aidge_interop.load_onnx(make_model("ConvTranspose", {"x": x, "w": w},
                                             {"strides": [2, 2], "output_shape": shape}))
          .forward([x, w])[0] for shape in ([9, 8], [2, 2, 9, 8])]
    assert ys[0].shape == (2, 2, 9, 8)
    np.testing.assert_array_equal(ys[0], ys[1])


# ---------------------------------------------------------------- MaxPool

def _onnx_indices(x, idx):
    """torch's per-plane indices as ONNX's indices into the whole tensor."""
    N, C = x.shape[:2]
    plane = int(np.prod(x.shape[2:]))
    return idx + torch.arange(N * C).reshape(N, C, *[1] * (x.dim() - 2)) * plane


# (N, C, spatial, kernel, strides, dilations, pads, ceil_mode)
MAXPOOL_CASES = {
    "1d": (2, 3, (11,), (3,), (2,), (1,), (1, 1), 0),
    "1d_ceil_dil": (3, 2, (10,), (2,), (3,), (2,), (0, 0), 1),
    "2d_2x2": (2, 8, (8, 8), (2, 2), (2, 2), (1, 1), None, 0),
    "2d_odd_ceil": (1, 3, (7, 9), (3, 2), (2, 2), (1, 1), (1, 0, 1, 0), 1),
    "2d_nonsquare_dil": (3, 2, (9, 11), (2, 3), (1, 2), (2, 1), (1, 1, 1, 1), 0),
    "2d_overlap_ceil": (2, 2, (6, 5), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1),
    "3d": (2, 2, (5, 6, 7), (2, 3, 2), (2, 1, 2), (1, 1, 1), (0, 1, 1, 0, 1, 1), 0),
    "3d_ceil": (1, 3, (5, 5, 4), (2, 2, 2), (2, 2, 2), (1, 1, 1), None, 1),
}


@dtypes
@pytest.mark.parametrize("case", list(MAXPOOL_CASES))
def test_max_pool_with_indices(case, dtype):
    N, C, sp, k, s, d, pads, ceil = MAXPOOL_CASES[case]
    nsp = len(sp)
    pad = 0 if pads is None else pads[:nsp]

    def ref(x):
        y, idx = MAXP[nsp](x, k, s, pad, d, bool(ceil), return_indices=True)
        return y, _onnx_indices(x, idx)

    attrs = {"kernel_shape": list(k), "strides": list(s), "dilations": list(d),
             "ceil_mode": ceil}
    if pads is not None:
        attrs["pads"] = list(pads)
    check_op("MaxPool", {"x": _x((N, C, *sp), dtype)}, ref, attrs=attrs, n_outputs=2)


@dtypes
@pytest.mark.parametrize("sp,k,s,pads", [((7, 8), (3, 3), (2, 2), (0, 2, 1, 1)),
                                         ((9,), (4,), (3,), (3, 0))], ids=str)
def test_max_pool_asymmetric_pads(sp, k, s, pads, dtype):
    nsp = len(sp)
    ref = lambda x: MAXP[nsp](F.pad(x, _torch_pad(pads), value=-np.inf), k, s)
    check_op("MaxPool", {"x": _x((2, 3, *sp), dtype)}, ref,
             attrs={"kernel_shape": list(k), "strides": list(s), "pads": list(pads)})


@dtypes
@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_max_pool_auto_pad(mode, dtype):
    sp, k, s = (7, 6), (3, 2), (2, 2)
    pads = [0] * 4 if mode == "VALID" else _same_pads(sp, k, s, (1, 1), mode == "SAME_UPPER")
    ref = lambda x: F.max_pool2d(F.pad(x, _torch_pad(pads), value=-np.inf), k, s)
    check_op("MaxPool", {"x": _x((2, 3, *sp), dtype)}, ref,
             attrs={"kernel_shape": list(k), "strides": list(s), "auto_pad": mode})


def test_max_pool_ties_route_to_first_maximum():
    x = np.random.default_rng(0).integers(0, 3, (2, 2, 7, 7)).astype(np.float64)
    ref = lambda x: F.max_pool2d(x, 3, 1, 1, return_indices=True)
    check_op("MaxPool", {"x": x}, lambda x: (ref(x)[0], _onnx_indices(x, ref(x)[1])),
             attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, n_outputs=2)


@dtypes
@pytest.mark.parametrize("width", [11, 37])
@pytest.mark.parametrize("k,s", [(2, 2), (3, 1), (3, 2), ((2, 3), (1, 2)), (2, 3)], ids=str)
def test_max_pool_unpadded_ties_nan_inf(k, s, width, dtype):
    """Windows inside the input (the vector kernel: 8 outputs of a row at a
    time, the last vector partial, stride 1 or 2; one by one at other strides
    and on the last rows of the last plane): ties go to the first maximum in
    scan order, NaN wins (the last NaN of a window, like torch), an all -inf
    window points at its first element."""
    x = np.random.default_rng(1).integers(0, 3, (2, 3, 9, width)).astype(dtype)
    x[0, 0, 2, 3] = x[0, 0, 2, 4] = x[1, 2, 5, 5] = x[1, 2, 7, 9] = x[0, 1, 3, 10] = np.nan
    x[1, 1, :4, :4] = -np.inf
    x[0, 2, 4:, -9:] = -np.inf
    ref = lambda x: F.max_pool2d(x, k, s, return_indices=True)
    check_op("MaxPool", {"x": x}, lambda x: (ref(x)[0], _onnx_indices(x, ref(x)[1])),
             grad=False, n_outputs=2,
             attrs={"kernel_shape": list(np.broadcast_to(k, 2)),
                    "strides": list(np.broadcast_to(s, 2))})


def test_max_pool_nan_propagates():
    x = _x((1, 1, 4, 4), np.float64)
    x[0, 0, 1, 2] = np.nan
    check_op("MaxPool", {"x": x}, lambda x: F.max_pool2d(x, 2), grad=False,
             attrs={"kernel_shape": [2, 2], "strides": [2, 2]})


# ---------------------------------------------------------------- AveragePool

# (N, C, spatial, kernel, strides, pads, ceil_mode)
AVGPOOL_CASES = {
    "1d": (2, 3, (11,), (3,), (2,), (1, 1), 0),
    "1d_ceil": (3, 2, (10,), (4,), (3,), (2, 2), 1),
    "2d_2x2": (2, 4, (8, 8), (2, 2), (2, 2), None, 0),
    "2d_odd_ceil": (1, 3, (7, 9), (3, 2), (2, 2), (1, 0, 1, 0), 1),
    "2d_nonsquare": (3, 2, (9, 11), (3, 4), (1, 3), (1, 2, 1, 2), 0),
    "2d_overlap_ceil": (2, 2, (6, 5), (3, 3), (2, 2), (1, 1, 1, 1), 1),
    "3d": (2, 2, (5, 6, 7), (2, 3, 2), (2, 1, 2), (1, 1, 1, 1, 1, 1), 0),
    "3d_ceil": (1, 3, (5, 5, 4), (3, 2, 2), (2, 2, 3), None, 1),
    # a window that is the whole plane (KWS's last pool): the global kernels
    "2d_whole_plane": (3, 4, (25, 5), (25, 5), (1, 1), None, 0),
    "1d_whole_plane_ceil": (2, 3, (11,), (11,), (3,), None, 1),
}


@dtypes
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("case", list(AVGPOOL_CASES))
def test_average_pool(case, count_include_pad, dtype):
    N, C, sp, k, s, pads, ceil = AVGPOOL_CASES[case]
    nsp = len(sp)
    pad = 0 if pads is None else pads[:nsp]
    ref = lambda x: AVGP[nsp](x, k, s, pad, bool(ceil), bool(count_include_pad))
    attrs = {"kernel_shape": list(k), "strides": list(s), "ceil_mode": ceil,
             "count_include_pad": count_include_pad}
    if pads is not None:
        attrs["pads"] = list(pads)
    check_op("AveragePool", {"x": _x((N, C, *sp), dtype)}, ref, attrs=attrs)


def _avg_pool_padded(nsp, k, s, pads, count_include_pad):
    """Average pool with ONNX pads (no ceil_mode): zero-pad, then divide the
    window sums by the number of counted positions."""
    def fn(x):
        means = AVGP[nsp](F.pad(x, _torch_pad(pads)), k, s)  # sum / prod(k)
        if count_include_pad:
            return means
        return means / AVGP[nsp](F.pad(torch.ones_like(x), _torch_pad(pads)), k, s)
    return fn


@dtypes
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("sp,k,s,pads", [((7, 8), (3, 3), (2, 2), (0, 2, 1, 1)),
                                         ((9,), (4,), (3,), (3, 0)),
                                         ((4, 5, 6), (2, 3, 3), (1, 2, 2), (1, 0, 2, 0, 1, 1))],
                         ids=str)
def test_average_pool_asymmetric_pads(sp, k, s, pads, count_include_pad, dtype):
    check_op("AveragePool", {"x": _x((2, 3, *sp), dtype)},
             _avg_pool_padded(len(sp), k, s, pads, count_include_pad),
             attrs={"kernel_shape": list(k), "strides": list(s), "pads": list(pads),
                    "count_include_pad": count_include_pad})


@dtypes
@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_average_pool_auto_pad(mode, dtype):
    sp, k, s = (7, 6), (3, 2), (2, 2)
    pads = [0] * 4 if mode == "VALID" else _same_pads(sp, k, s, (1, 1), mode == "SAME_UPPER")
    check_op("AveragePool", {"x": _x((2, 3, *sp), dtype)},
             _avg_pool_padded(2, k, s, pads, 0),
             attrs={"kernel_shape": list(k), "strides": list(s), "auto_pad": mode})


@dtypes
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_dilations(count_include_pad, dtype):
    # opset 19 dilations (torch's avg_pool has none): the mean of the taps
    # through F.unfold, which pads symmetrically
    k, s, d, p = (2, 3), (2, 1), (2, 2), (1, 2)

    def ref(x):
        cols = F.unfold(x, k, d, p, s)  # (N, C*K, L)
        N, C = x.shape[:2]
        sums = cols.reshape(N, C, -1, cols.shape[-1]).sum(2)
        if count_include_pad:
            div = float(np.prod(k))
        else:
            div = F.unfold(torch.ones_like(x[:, :1]), k, d, p, s).sum(1, keepdim=True)
        out = [(n + 2 * pp - dd * (kk - 1) - 1) // ss + 1
               for n, kk, ss, dd, pp in zip(x.shape[2:], k, s, d, p)]
        return (sums / div).reshape(N, C, *out)

    check_op("AveragePool", {"x": _x((2, 3, 9, 8), dtype)}, ref, opset=19,
             attrs={"kernel_shape": list(k), "strides": list(s), "dilations": list(d),
                    "pads": [p[0], p[1], p[0], p[1]], "count_include_pad": count_include_pad})


# ---------------------------------------------------------------- global pools

GLOBAL_SHAPES = [(2, 3, 7), (3, 4, 5, 6), (1, 2, 3, 4, 5), (2, 2, 3, 2, 2, 3)]


def _keep(x, y):
    return y.reshape(*x.shape[:2], *[1] * (x.dim() - 2))


@dtypes
@pytest.mark.parametrize("shape", GLOBAL_SHAPES, ids=str)
def test_global_average_pool(shape, dtype):
    nsp = len(shape) - 2
    adaptive = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}
    if nsp in adaptive:
        ref = lambda x: adaptive[nsp](x, 1)
    else:
        ref = lambda x: x.mean(tuple(range(2, x.dim())), keepdim=True)
    check_op("GlobalAveragePool", {"x": _x(shape, dtype)}, ref)


@dtypes
@pytest.mark.parametrize("shape", GLOBAL_SHAPES, ids=str)
def test_global_max_pool(shape, dtype):
    nsp = len(shape) - 2
    adaptive = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}
    if nsp in adaptive:
        ref = lambda x: adaptive[nsp](x, 1)
    else:
        ref = lambda x: _keep(x, x.flatten(2).max(-1).values)
    check_op("GlobalMaxPool", {"x": _x(shape, dtype)}, ref)


# ---------------------------------------------------------------- finite differences

def _fd_check(op, inputs, attrs, eps=1e-6):
    """float64 engine gradients of sum(y * gy) against central differences."""
    model = make_model(op, inputs, attrs)
    g = aidge_interop.load_onnx(model)
    names = list(inputs)
    vals = [inputs[n].copy() for n in names]
    (y,) = g.forward(vals, need_backward=True, input_grads=True)
    gy = np.random.default_rng(5).standard_normal(y.shape)
    grads = g.backward([gy])
    for i, n in enumerate(names):
        num = np.zeros_like(vals[i])
        for j in range(vals[i].size):
            for sign in (1, -1):
                v = [a.copy() for a in vals]
                v[i].reshape(-1)[j] += sign * eps
                (yy,) = g.forward(v)
                num.reshape(-1)[j] += sign * np.sum(yy * gy) / (2 * eps)
        np.testing.assert_allclose(grads[i], num, rtol=1e-6, atol=1e-7, err_msg=f"{op} d{n}")


def test_finite_differences():
    f = np.float64
    _fd_check("Conv", {"x": _x((2, 2, 5, 4), f, 1), "w": _x((4, 1, 2, 3), f, 2),
                       "b": _x((4,), f, 3)},
              {"strides": [2, 1], "pads": [1, 0, 0, 2], "dilations": [1, 2], "group": 2})
    _fd_check("ConvTranspose", {"x": _x((1, 2, 3, 4), f, 1), "w": _x((2, 2, 3, 2), f, 2),
                                "b": _x((4,), f, 3)},
              {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 1], "group": 2})
    _fd_check("MaxPool", {"x": _x((1, 2, 5, 6), f, 1)},
              {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1})
    _fd_check("AveragePool", {"x": _x((1, 2, 5, 6), f, 1)},
              {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 0, 1], "ceil_mode": 1})
    _fd_check("GlobalMaxPool", {"x": _x((2, 2, 3, 3), f, 1)}, {})
    _fd_check("GlobalAveragePool", {"x": _x((2, 2, 3, 3), f, 1)}, {})


# ---------------------------------------------------------------- errors

def _fails(op, inputs, attrs, match, n_outputs=1):
    with pytest.raises(Exception, match=match):
        g = aidge_interop.load_onnx(make_model(op, inputs, attrs, n_outputs=n_outputs))
        g.forward(list(inputs.values()))


def test_errors_name_the_attribute():
    f = np.float32
    x, w = _x((1, 8, 5, 5), f), _x((6, 4, 3, 3), f)
    _fails("Conv", {"x": x, "w": w}, {"group": 3}, "group 3 does not divide 8 input channels")
    _fails("Conv", {"x": _x((1, 3, 5, 5), f), "w": w}, {}, "input has 3 channels; the weight "
           "expects 4")
    _fails("Conv", {"x": x, "w": w}, {"group": 2, "kernel_shape": [3, 2]}, "kernel_shape")
    _fails("Conv", {"x": x, "w": w}, {"group": 2, "pads": [1, 1]}, "pads has 2 values")
    _fails("Conv", {"x": x, "w": w}, {"group": 2, "strides": [0, 1]}, r"strides\[0\] is 0")
    _fails("Conv", {"x": x, "w": w}, {"group": 2, "pads": [1] * 4, "auto_pad": "VALID"},
           "pads and auto_pad")
    _fails("Conv", {"x": x, "w": w, "b": _x((5,), f)}, {"group": 2}, "bias")
    _fails("Conv", {"x": x, "w": w}, {"group": 2, "dilations": [3, 3]}, "kernel spans 7")
    _fails("Conv", {"x": x.astype(np.float64), "w": w}, {"group": 2}, "weight is float32")
    _fails("ConvTranspose", {"x": x, "w": _x((8, 2, 3, 3), f)},
           {"strides": [2, 2], "output_padding": [2, 0]}, "output_padding")
    _fails("ConvTranspose", {"x": x, "w": _x((8, 2, 3, 3), f)},
           {"output_shape": [20, 20]}, "output_shape")
    _fails("ConvTranspose", {"x": x, "w": _x((6, 2, 3, 3), f)}, {}, "input has 8 channels")
    _fails("MaxPool", {"x": x}, {"kernel_shape": [2, 2], "storage_order": 2},
           "storage_order is 2", n_outputs=2)
    _fails("MaxPool", {"x": x}, {"strides": [2, 2]}, "kernel_shape is required")
    _fails("MaxPool", {"x": x}, {"kernel_shape": [7, 2]}, "window spans 7")
    _fails("AveragePool", {"x": x}, {"kernel_shape": [2, 2, 2]}, "kernel_shape has 3 values")
    _fails("AveragePool", {"x": x}, {"kernel_shape": [2, 2], "ceil_mode": 2}, "ceil_mode")
    _fails("GlobalAveragePool", {"x": _x((3, 4), f)}, {}, "rank 2")


# ---------------------------------------------------------------- Resize

class _Interpolate(torch.nn.Module):
    def __init__(self, conv, **kw):
        super().__init__()
        self.conv, self.kw = conv, kw

    def forward(self, x):
        return F.interpolate(self.conv(x), **self.kw)


RESIZE_CASES = [
    ((2, 3, 5, 6), dict(scale_factor=2, mode="nearest")),
    ((2, 3, 5, 6), dict(scale_factor=1.5, mode="nearest")),
    ((2, 3, 5, 6), dict(size=(7, 11), mode="nearest")),
    ((2, 3, 5, 6), dict(size=(3, 4), mode="nearest")),
    ((2, 3, 5, 6), dict(scale_factor=2, mode="bilinear", align_corners=False)),
    ((2, 3, 5, 6), dict(scale_factor=2, mode="bilinear", align_corners=True)),
    ((2, 3, 5, 6), dict(size=(9, 4), mode="bilinear", align_corners=False)),
    ((2, 3, 5, 6), dict(size=(9, 4), mode="bilinear", align_corners=True)),
    ((2, 3, 8, 8), dict(scale_factor=0.5, mode="bilinear", align_corners=False)),
    ((2, 3, 5, 6), dict(scale_factor=1.7, mode="bilinear", align_corners=False)),
    ((2, 3, 5, 6), dict(size=(1, 1), mode="bilinear", align_corners=True)),
    ((2, 3, 10), dict(scale_factor=2, mode="linear", align_corners=False)),
    ((2, 3, 10), dict(size=17, mode="nearest")),
    ((2, 3, 4, 5, 3), dict(scale_factor=2, mode="trilinear", align_corners=False)),
    ((2, 3, 4, 5, 3), dict(size=(5, 7, 2), mode="nearest")),
]


@pytest.mark.parametrize("shape,kw", RESIZE_CASES,
                         ids=[f"{len(s) - 2}d-" + "-".join(f"{k}={v}" for k, v in kw.items())
                              for s, kw in RESIZE_CASES])
def test_resize_as_torch_interpolate(shape, kw):
    """F.interpolate exports as Resize (scales or sizes, nearest or linear,
    align_corners or pytorch_half_pixel): the wrapped model's output and the
    gradients of the input and of the conv before it, at two batch sizes."""
    torch.manual_seed(0)
    conv = [torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d][len(shape) - 3](3, 4, 1)
    model = _Interpolate(conv, **kw)
    wrapped = aidge_interop.wrap(model, [shape])
    for batch in (shape[0], 3):
        check_wrapped_step(model, wrapped, torch.randn((batch,) + shape[1:]),
                           grad_rtol=1e-5, grad_atol=1e-4)


def _resize_model(attrs, scales=None, sizes=None, shape=(1, 1, 2, 3), dtype=np.float32):
    from onnx import helper, numpy_helper

    inits, names = [], ["x", ""]
    for name, v, dt in (("scales", scales, np.float32), ("sizes", sizes, np.int64)):
        names.append(name if v is not None else "")
        if v is not None:
            inits.append(numpy_helper.from_array(np.array(v, dt), name))
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Resize", names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)],
        [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.5, 0.7], [1, 1, 1.5, 2.5]])
def test_resize11_tf_half_pixel_for_nn_equals_onnxruntime(scales):
    """Resize-11's tf_half_pixel_for_nn (source = (x + 0.5) / scale), against ORT."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper

    x = _x((1, 2, 4, 5), np.float32)
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="nearest",
                            coordinate_transformation_mode="tf_half_pixel_for_nn")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", 1, x.shape)],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
         numpy_helper.from_array(np.array(scales, np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (got,) = aidge_interop.load_onnx(model).forward([x])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "align_corners"])
def test_resize_linear_finite_differences(coord):
    x = _x((1, 2, 3, 4), np.float64)
    model = _resize_model({"mode": "linear", "coordinate_transformation_mode": coord},
                          scales=[1, 1, 1.5, 0.75], shape=x.shape, dtype=np.float64)
    g = aidge_interop.load_onnx(model)  # (scales: a constant, as a Resize input)
    (y,) = g.forward([x], need_backward=True, input_grads=True)
    gy = np.random.default_rng(1).standard_normal(y.shape)
    (gx,) = g.backward([gy])
    num = np.zeros_like(x)
    for i in range(x.size):
        xp, xm = x.copy(), x.copy()
        xp.flat[i] += 1e-6
        xm.flat[i] -= 1e-6
        num.flat[i] = np.sum(gy * (g.forward([xp])[0] - g.forward([xm])[0])) / 2e-6
    np.testing.assert_allclose(gx, num, rtol=1e-6, atol=1e-8)


def test_resize_refusals_name_the_node_and_value():
    x = _x((1, 1, 2, 3), np.float32)
    with pytest.raises(ValueError, match="Resize node.*mode 'bicubic'; one of 'nearest'"):
        aidge_interop.load_onnx(_resize_model({"mode": "bicubic"}, scales=[1, 1, 2, 2])) \
            .forward([x])
    with pytest.raises(ValueError, match="Resize node.*both scales and sizes"):
        aidge_interop.load_onnx(_resize_model({}, scales=[1, 1, 2, 2], sizes=[1, 1, 4, 6])) \
            .forward([x])
    with pytest.raises(ValueError, match="Resize node.*scales has 2 values; 4 expected"):
        aidge_interop.load_onnx(_resize_model({}, scales=[2, 2])).forward([x])
    with pytest.raises(ValueError, match=r"Resize node.*scales\[2\] is -2"):
        aidge_interop.load_onnx(_resize_model({}, scales=[1, 1, -2, 2])).forward([x])
