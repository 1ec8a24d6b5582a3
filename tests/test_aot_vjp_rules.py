"""Every VJP rule against eager autograd (float64), with broadcasting, through the whole AOT pipeline."""
from __future__ import annotations

import zlib

import pytest
import torch

from tininductor import config
from tininductor.aot_autograd import aot_eager
from tininductor.decompositions import CUMSUM_MAX_LENGTH
from tininductor.prims import PRIM_SET
from tininductor.vjp_rules import VJP_RULES, sum_to_size

aten = torch.ops.aten
prims = torch.ops.prims


def R(*shape):  # a float input that requires grad
    return ("randn", shape)


def P(*shape):  # a positive float input (log, sqrt, pow ...)
    return ("pos", shape)


def I(high, *shape):  # an index tensor
    return ("int", (high, shape))


def T(*shape):  # small integers as floats: many ties, for max/min rules
    return ("ties", shape)


def M(*shape):  # a bool mask
    return ("mask", shape)


def _make(spec):
    kind, arg = spec
    if kind == "randn":
        return torch.randn(*arg, dtype=torch.float64, requires_grad=True)
    if kind == "pos":
        return (torch.rand(*arg, dtype=torch.float64) + 0.5).requires_grad_()
    if kind == "int":
        high, shape = arg
        return torch.randint(0, high, shape)
    if kind == "perm":  # per-row distinct indices (scatter without duplicates)
        rows, high, k = arg
        return torch.stack([torch.randperm(high)[:k] for _ in range(rows)])
    if kind == "noreq":  # a float input that needs no gradient
        return torch.randn(*arg, dtype=torch.float64)
    if kind == "unit":  # in (0, 1), no gradient (targets, weights)
        return torch.rand(*arg, dtype=torch.float64) * 0.8 + 0.1
    if kind == "bin":  # probabilities 0 or 1: bernoulli draws are then certain
        return (torch.rand(*arg) > 0.5).to(torch.float64).requires_grad_()
    if kind == "ties":
        return torch.randint(-2, 3, arg).to(torch.float64).requires_grad_()
    return torch.rand(*arg) > 0.5


#: name -> (fn written with prims, input specs, the prim whose rule it exercises[, eager reference])
CASES = {
    "neg": (lambda x: aten.neg(x), [R(3, 4)], aten.neg),
    "abs": (lambda x: aten.abs(x), [R(3, 4)], aten.abs),
    "exp": (lambda x: aten.exp(x), [R(3, 4)], aten.exp),
    "log": (lambda x: aten.log(x), [P(3, 4)], aten.log),
    "log1p": (lambda x: aten.log1p(x), [P(3, 4)], aten.log1p),
    "expm1": (lambda x: aten.expm1(x), [R(3, 4)], aten.expm1),
    "sqrt": (lambda x: aten.sqrt(x), [P(3, 4)], aten.sqrt),
    "rsqrt": (lambda x: aten.rsqrt(x), [P(3, 4)], aten.rsqrt),
    "reciprocal": (lambda x: aten.reciprocal(x), [P(3, 4)], aten.reciprocal),
    "sin": (lambda x: aten.sin(x), [R(3, 4)], aten.sin),
    "cos": (lambda x: aten.cos(x), [R(3, 4)], aten.cos),
    "tanh": (lambda x: aten.tanh(x), [R(3, 4)], aten.tanh),
    "sigmoid": (lambda x: aten.sigmoid(x), [R(3, 4)], aten.sigmoid),
    "erf": (lambda x: aten.erf(x), [R(3, 4)], aten.erf),
    "relu": (lambda x: aten.relu(x), [R(3, 4)], aten.relu),
    "sign": (lambda x: aten.mul(aten.sign(x), x), [R(3, 4)], aten.sign),
    "add": (lambda a, b: aten.add(a, b), [R(2, 3, 4), R(4)], aten.add),
    "add_scalar": (lambda a: aten.add(a, 2.5), [R(3, 4)], aten.add),
    "sub": (lambda a, b: aten.sub(a, b), [R(3, 1), R(1, 4)], aten.sub),
    "mul": (lambda a, b: aten.mul(a, b), [R(2, 3, 4), R(3, 1)], aten.mul),
    "div": (lambda a, b: aten.div(a, b), [R(3, 4), P(4)], aten.div),
    "div_scalar": (lambda a: aten.div(a, 3.0), [R(3, 4)], aten.div),
    "pow_scalar": (lambda a: aten.pow(a, 3.0), [R(3, 4)], aten.pow),
    "pow_tensor": (lambda a, b: aten.pow(a, b), [P(3, 4), R(3, 1)], aten.pow),
    "maximum": (lambda a, b: aten.maximum(a, b), [R(3, 4), R(4)], aten.maximum),
    "minimum": (lambda a, b: aten.minimum(a, b), [R(2, 1, 4), R(3, 1)], aten.minimum),
    "maximum_ties": (lambda a, b: aten.maximum(a, b), [T(3, 4), T(3, 4)], aten.maximum),
    "minimum_ties": (lambda a, b: aten.minimum(a, b), [T(3, 4), T(4)], aten.minimum),
    "comparisons": (lambda a, b: aten.where(aten.logical_or(aten.logical_and(aten.gt(a, b), aten.le(a, 1.0)),
                                                           aten.logical_not(aten.ne(a, aten.lt(b, 0.0)))),
                                            a, b), [R(3, 4), R(4)], aten.gt),
    "eq_ge": (lambda a: aten.where(aten.ge(a, 0.0), a, aten.mul(a, aten.eq(a, a))), [R(3, 4)], aten.ge),
    "where": (lambda c, a, b: aten.where(c, a, b), [M(3, 4), R(4), R(3, 1)], aten.where),
    "convert_element_type": (lambda a: prims.convert_element_type(aten.mul(a, a), torch.float32), [R(3, 4)],
                             prims.convert_element_type, lambda a: (a * a).to(torch.float32)),
    "clone_alias": (lambda a: aten.mul(aten.clone(a), aten.alias(a)), [R(3, 4)], aten.clone),
    "detach": (lambda a: aten.mul(aten.detach(a), a), [R(3, 4)], aten.detach),  # a gradient only through `a`
    "view": (lambda a: aten.view(a, [4, 3]), [R(3, 4)], aten.view),
    "expand": (lambda a: aten.expand(a, [2, 3, 4]), [R(3, 1)], aten.expand),
    "permute": (lambda a: aten.permute(a, [2, 0, 1]), [R(2, 3, 4)], aten.permute),
    "as_strided": (lambda a: aten.as_strided(a * 1, [3, 2], [1, 3]), [R(2, 3)], aten.as_strided),
    "unsqueeze": (lambda a: aten.unsqueeze(a, -1), [R(3, 4)], aten.unsqueeze),
    "squeeze": (lambda a: aten.squeeze(a, [1]), [R(3, 1, 4)], aten.squeeze),
    "slice": (lambda a: aten.slice(a, 1, 1, 5, 2), [R(3, 6)], aten.slice),
    "slice_negative": (lambda a: aten.slice(a, 0, -2), [R(3, 6)], aten.slice),
    "select": (lambda a: aten.select(a, 1, -1), [R(3, 4, 2)], aten.select),
    "sum": (lambda a: aten.sum(a, [0, 2]), [R(2, 3, 4)], aten.sum),
    "sum_keepdim": (lambda a: aten.sum(a, [-1], True), [R(2, 3, 4)], aten.sum),
    "sum_all": (lambda a: aten.sum(a), [R(2, 3)], aten.sum),
    "mean": (lambda a: aten.mean(a, [1]), [R(2, 3, 4)], aten.mean),
    "amax": (lambda a: aten.amax(a, [1], True), [R(3, 5)], aten.amax),
    "amax_ties": (lambda a: aten.amax(a, [1]), [T(3, 5)], aten.amax),
    "amin": (lambda a: aten.amin(a, [0, 1]), [R(3, 5)], aten.amin),
    "var": (lambda a: aten.var(a, [1], correction=1), [R(3, 5)], aten.var),
    "var_keepdim_biased": (lambda a: aten.var(a, [0, 2], correction=0, keepdim=True), [R(2, 3, 4)], aten.var),
    "creation": (lambda a: aten.add(aten.mul(a, aten.full([3, 4], 2.0, dtype=torch.float64)),
                                    aten.arange(4, dtype=torch.float64)), [R(3, 4)], aten.full),
    "scalar_tensor": (lambda a: aten.mul(a, aten.scalar_tensor(3.0, dtype=torch.float64)), [R(2)],
                      aten.scalar_tensor),
    "index": (lambda w, i: aten.index(w, [i]), [R(5, 3), I(5, 2, 6)], aten.index),
    "index_2d": (lambda w, i, j: aten.index(w, [i, j]), [R(5, 4), I(5, 7), I(4, 7)], aten.index),
    "index_put": (lambda x, v, i: aten.index_put(x, [i], v), [R(6, 3), R(3), I(6, 2)], aten.index_put),
    "index_put_accumulate": (lambda x, v, i: aten.index_put(x, [i], v, True), [R(6, 3), R(4, 3), I(6, 4)],
                             aten.index_put),
    "gather": (lambda x, i: aten.gather(x, 1, i), [R(3, 5), I(5, 3, 4)], aten.gather),
    "scatter_add": (lambda x, i, s: aten.scatter_add(x, 1, i, s), [R(3, 5), I(5, 3, 4), R(3, 4)],
                    aten.scatter_add),
    "mm": (lambda a, b: aten.mm(a, b), [R(3, 4), R(4, 5)], aten.mm),
    # fallback ops (outside the prim set) with rules, so training works through them
    "cat": (lambda a, b: aten.mul(aten.cat([a, b, a], 1), 2.0), [R(2, 3), R(2, 1)], aten.cat),
    "stack": (lambda a, b: torch.stack([a, b], -1), [R(2, 3), R(2, 3)], aten.cat),
    "bmm": (lambda a, b: aten.bmm(a, b), [R(2, 3, 4), R(2, 4, 5)], aten.bmm),
    # multi-output ops: the rule gets one gradient per output (None where unused)
    "max_dim": (lambda x: torch.max(x, 1).values * 2, [R(3, 5)], aten.max),
    "max_dim_keepdim": (lambda x: torch.max(x, -1, keepdim=True)[0].exp(), [R(2, 3, 4)], aten.max),
    "max_all": (lambda x: torch.max(x), [T(3, 4)], aten.max),
    "min_dim": (lambda x: torch.min(x, 0)[0], [R(4, 3)], aten.min),
    "sort": (lambda x: torch.sort(x, 1, descending=True).values[:, :2], [R(3, 5)], aten.sort),
    "sort_stable": (lambda x: torch.sort(x, stable=True, dim=0).values, [R(4, 3)], aten.sort),
    "topk": (lambda x: torch.topk(x, 2, 1).values.square(), [R(3, 5)], aten.topk),
    "kthvalue": (lambda x: torch.kthvalue(x, 2, 1).values, [R(3, 5)], aten.kthvalue),
    "mode": (lambda x: torch.mode(x, 1).values, [T(3, 5)], aten.mode),
    "median_dim": (lambda x: torch.median(x, 1).values, [R(3, 5)], aten.median),
    "median_all_ties": (lambda x: torch.median(x), [T(3, 4)], aten.median),
    "nanmedian_all": (lambda x: torch.nanmedian(x), [R(3, 5)], aten.nanmedian),
    "nanmedian_dim": (lambda x: torch.nanmedian(x, 0).values, [R(4, 3)], aten.nanmedian),
    "cummax": (lambda x: torch.cummax(x, 1).values, [T(3, 6)], aten.cummax),
    "cummin": (lambda x: torch.cummin(x, 0).values, [T(5, 2)], aten.cummin),
    "var_mean": (lambda x: (lambda vm: vm[0] * vm[1])(torch.var_mean(x, 1)), [R(3, 5)], aten.var_mean),
    "var_mean_only_mean": (lambda x: torch.var_mean(x, [0, 2], correction=0)[1], [R(2, 3, 4)], aten.var_mean),
    "std": (lambda x: torch.std(x, 1, keepdim=True), [R(3, 5)], aten.std),
    "std_mean": (lambda x: (lambda sm: sm[0] + sm[1].square())(torch.std_mean(x, 0)), [R(4, 3)], aten.std_mean),
    "logsumexp": (lambda x: torch.logsumexp(x, 1), [R(3, 5)], aten.logsumexp),
    # normalisation (the fused ATen op stays; its backward is ATen's backward op)
    "group_norm": (lambda x, w, b: torch.nn.functional.group_norm(x, 2, w, b), [R(2, 4, 3), R(4), R(4)],
                   aten.native_group_norm),
    "batch_norm_train": (lambda x, w, b: torch.nn.functional.batch_norm(
        x, torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64), w, b, training=True),
        [R(4, 3, 2), R(3), R(3)], aten._native_batch_norm_legit),
    "batch_norm_functional": (lambda x, w, b: aten._native_batch_norm_legit_functional(
        x, w, b, torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64), True, 0.1, 1e-5)[0],
        [R(4, 3, 2), R(3), R(3)], aten._native_batch_norm_legit_functional,
        lambda x, w, b: torch.nn.functional.batch_norm(x, torch.zeros(3, dtype=torch.float64),
                                                       torch.ones(3, dtype=torch.float64), w, b, training=True)),
    "batch_norm_no_stats": (lambda x, w: torch.nn.functional.batch_norm(x, None, None, w, None, training=True),
                            [R(4, 3), R(3)], aten._native_batch_norm_legit),
    "batch_norm_eval": (lambda x, w, b: torch.nn.functional.batch_norm(
        x, torch.linspace(-1, 1, 3, dtype=torch.float64), torch.linspace(0.5, 2, 3, dtype=torch.float64), w, b),
        [R(4, 3, 2), R(3), R(3)], aten._native_batch_norm_legit_no_training),
    # attention: CPU flash kernel forward, its ATen backward
    "sdpa_causal": (lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                    [R(2, 2, 5, 4), R(2, 2, 5, 4), R(2, 2, 5, 4)], aten._scaled_dot_product_flash_attention_for_cpu),
    "sdpa_mask_scale": (lambda q, k, v, m: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=m, scale=0.3), [R(1, 2, 3, 4), R(1, 2, 6, 4), R(1, 2, 6, 4), M(3, 6)],
        aten._scaled_dot_product_flash_attention_for_cpu),
    # extern ops with ATen backward ops
    "convolution": (lambda x, w, b: torch.nn.functional.conv2d(x, w, b, stride=2, padding=1),
                    [R(2, 3, 6, 5), R(4, 3, 3, 3), R(4)], aten.convolution),
    "conv_transpose_groups": (lambda x, w: torch.nn.functional.conv_transpose1d(x, w, groups=2, output_padding=1,
                                                                                stride=2),
                              [R(2, 4, 5), R(4, 3, 3)], aten.convolution),
    "max_pool2d": (lambda x: torch.nn.functional.max_pool2d(x, 2, 1), [R(2, 3, 5, 5)], aten.max_pool2d_with_indices),
    "max_pool3d": (lambda x: torch.nn.functional.max_pool3d(x, 2), [R(1, 2, 4, 4, 4)], aten.max_pool3d_with_indices),
    "avg_pool2d": (lambda x: torch.nn.functional.avg_pool2d(x, 3, 2, 1), [R(2, 3, 6, 5)], aten.avg_pool2d),
    "adaptive_avg_pool2d": (lambda x: torch.nn.functional.adaptive_avg_pool2d(x, (2, 3)), [R(2, 3, 5, 7)],
                            aten._adaptive_avg_pool2d),
    # activations
    "mish": (lambda x: torch.nn.functional.mish(x), [R(3, 4)], aten.mish),
    "softplus": (lambda x: torch.nn.functional.softplus(x, 2.0, 1.0), [R(3, 4)], aten.softplus),
    "hardswish": (lambda x: torch.nn.functional.hardswish(x) * 3, [R(3, 4)], aten.hardswish),
    "hardsigmoid": (lambda x: torch.nn.functional.hardsigmoid(x * 4), [R(3, 4)], aten.hardsigmoid),
    "hardtanh": (lambda x: torch.nn.functional.hardtanh(x, -0.5, 0.7), [R(3, 4)], aten.hardtanh),
    "leaky_relu": (lambda x: torch.nn.functional.leaky_relu(x, 0.2), [R(3, 4)], aten.leaky_relu),
    "elu": (lambda x: torch.nn.functional.elu(x, 0.7), [R(3, 4)], aten.elu),
    "glu": (lambda x: torch.nn.functional.glu(x, 1), [R(3, 4)], aten.glu),
    "frac": (lambda x: torch.frac(x * 3), [R(3, 4)], aten.frac),
    "floor": (lambda x: torch.floor(x * 3) + x, [R(3, 4)], aten.floor),
    "ceil": (lambda x: torch.ceil(x * 3), [R(3, 4)], aten.ceil),
    "round": (lambda x: torch.round(x * 3), [R(3, 4)], aten.round),
    "trunc": (lambda x: torch.trunc(x * 3), [R(3, 4)], aten.trunc),
    "sgn": (lambda x: torch.sgn(x) * x, [R(3, 4)], aten.sgn),
    "bernoulli_0_1": (lambda x: torch.bernoulli(x) * 2, [("bin", (3, 4))], aten.bernoulli),
    "dropout_p1": (lambda x: aten.native_dropout(x, 1.0, True)[0] + x, [R(3, 4)], aten.native_dropout),
    "bitwise_and_mask": (lambda x: x * torch.bitwise_and(x > 0, x < 1), [R(3, 4)], aten.bitwise_and),
    "bitwise_or_mask": (lambda x: x * torch.bitwise_or(x > 1, x < -1), [R(3, 4)], aten.bitwise_or),
    # scans
    # a short cumsum decomposes into a masked sum; past CUMSUM_MAX_LENGTH it stays, with its rule
    "cumsum": (lambda x: torch.cumsum(x, 1), [R(2, CUMSUM_MAX_LENGTH + 1)], aten.cumsum),
    "cumprod": (lambda x: torch.cumprod(x, 0), [R(4, 3)], aten.cumprod),
    "cumprod_zero": (lambda x: torch.cumprod(x * (torch.arange(5) != 2), 1), [R(3, 5)], aten.cumprod),
    # indexing
    "embedding_padding_idx": (lambda w, i: torch.nn.functional.embedding(i, w, padding_idx=2),
                              [R(5, 3), I(5, 4, 6)], aten.detach),
    "embedding_scale_grad": (lambda w, i: torch.nn.functional.embedding(i, w, scale_grad_by_freq=True),
                             [R(5, 3), I(5, 4, 6)], aten.embedding),
    "index_select": (lambda x, i: torch.index_select(x, 1, i), [R(3, 5), I(5, 7)], aten.index_select),
    "index_add": (lambda x, i, s: torch.index_add(x, 0, i, s, alpha=2), [R(5, 3), I(5, 4), R(4, 3)],
                  aten.index_add),
    "scatter_src": (lambda x, i, s: torch.scatter(x, 1, i, s), [R(3, 5), ("perm", (3, 5, 2)), R(3, 2)],
                    aten.scatter),
    "scatter_value": (lambda x, i: torch.scatter(x, 0, i, 1.5), [R(4, 3), I(4, 2, 3)], aten.scatter),
    "flip": (lambda x: torch.flip(x, [0, 1]), [R(3, 4)], aten.flip),
    # pad, interpolate
    "constant_pad": (lambda x: torch.nn.functional.pad(x, (1, -1, 2, 0), value=0.5), [R(2, 3, 4)],
                     aten.constant_pad_nd),
    "reflection_pad1d": (lambda x: torch.nn.functional.pad(x, (2, 1), mode="reflect"), [R(2, 3, 4)],
                         aten.reflection_pad1d),
    "reflection_pad2d": (lambda x: torch.nn.functional.pad(x, (2, 1, 1, 1), mode="reflect"), [R(1, 2, 3, 4)],
                         aten.reflection_pad2d),
    "reflection_pad3d": (lambda x: torch.nn.functional.pad(x, (1, 1, 1, 0, 0, 1), mode="reflect"),
                         [R(1, 1, 3, 3, 3)], aten.reflection_pad3d),
    "replication_pad1d": (lambda x: torch.nn.functional.pad(x, (2, 1), mode="replicate"), [R(2, 3, 4)],
                          aten.replication_pad1d),
    "replication_pad2d": (lambda x: torch.nn.functional.pad(x, (2, 1, 0, 3), mode="replicate"), [R(1, 2, 3, 4)],
                          aten.replication_pad2d),
    "replication_pad3d": (lambda x: torch.nn.functional.pad(x, (1, 1, 1, 0, 0, 1), mode="replicate"),
                          [R(1, 1, 3, 3, 3)], aten.replication_pad3d),
    "upsample_nearest1d": (lambda x: torch.nn.functional.interpolate(x, scale_factor=2), [R(2, 3, 4)],
                           aten._unsafe_index),
    "upsample_nearest2d": (lambda x: torch.nn.functional.interpolate(x, size=(5, 7)), [R(1, 2, 3, 4)],
                           aten._unsafe_index),
    "upsample_nearest3d": (lambda x: torch.nn.functional.interpolate(x, scale_factor=2), [R(1, 1, 2, 2, 3)],
                           aten._unsafe_index),
    "upsample_nearest_exact1d": (lambda x: torch.nn.functional.interpolate(x, size=7, mode="nearest-exact"),
                                 [R(2, 3, 4)], aten._unsafe_index),
    "upsample_nearest_exact2d": (lambda x: torch.nn.functional.interpolate(x, size=(5, 3), mode="nearest-exact"),
                                 [R(1, 2, 3, 4)], aten._unsafe_index),
    "upsample_nearest_exact3d": (lambda x: torch.nn.functional.interpolate(x, size=(3, 3, 2),
                                                                           mode="nearest-exact"),
                                 [R(1, 1, 2, 2, 3)], aten._unsafe_index),
    "upsample_linear1d": (lambda x: torch.nn.functional.interpolate(x, size=7, mode="linear"), [R(2, 3, 4)],
                          aten._unsafe_index),
    "upsample_bilinear2d": (lambda x: torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear",
                                                                      align_corners=True),
                            [R(1, 2, 3, 4)], aten._unsafe_index),
    "upsample_bilinear2d_aa": (lambda x: torch.nn.functional.interpolate(x, size=(2, 3), mode="bilinear",
                                                                         antialias=True),
                               [R(1, 2, 5, 6)], aten._upsample_bilinear2d_aa),
    "upsample_bicubic2d": (lambda x: torch.nn.functional.interpolate(x, size=(5, 7), mode="bicubic"),
                           [R(1, 2, 3, 4)], aten._unsafe_index),
    "upsample_bicubic2d_aa": (lambda x: torch.nn.functional.interpolate(x, size=(2, 3), mode="bicubic",
                                                                        antialias=True),
                              [R(1, 2, 5, 6)], aten._upsample_bicubic2d_aa),
    "upsample_trilinear3d": (lambda x: torch.nn.functional.interpolate(x, scale_factor=2, mode="trilinear"),
                             [R(1, 1, 2, 2, 3)], aten._unsafe_index),
    # more pointwise math
    "log2": (lambda x: torch.log2(x), [P(3, 4)], aten.log2),
    "log10": (lambda x: torch.log10(x), [P(3, 4)], aten.log10),
    "exp2": (lambda x: torch.exp2(x), [R(3, 4)], aten.exp2),
    "tan": (lambda x: torch.tan(x), [R(3, 4)], aten.tan),
    "sinh": (lambda x: torch.sinh(x), [R(3, 4)], aten.sinh),
    "cosh": (lambda x: torch.cosh(x), [R(3, 4)], aten.cosh),
    "asin": (lambda x: torch.asin(torch.tanh(x) * 0.9), [R(3, 4)], aten.asin),
    "acos": (lambda x: torch.acos(torch.tanh(x) * 0.9), [R(3, 4)], aten.acos),
    "atan": (lambda x: torch.atan(x), [R(3, 4)], aten.atan),
    "asinh": (lambda x: torch.asinh(x), [R(3, 4)], aten.asinh),
    "acosh": (lambda x: torch.acosh(x + 1), [P(3, 4)], aten.acosh),
    "atanh": (lambda x: torch.atanh(torch.tanh(x) * 0.9), [R(3, 4)], aten.atanh),
    "erfc": (lambda x: torch.erfc(x), [R(3, 4)], aten.erfc),
    "erfinv": (lambda x: torch.erfinv(torch.tanh(x) * 0.9), [R(3, 4)], aten.erfinv),
    "lgamma": (lambda x: torch.lgamma(x), [P(3, 4)], aten.lgamma),
    "digamma": (lambda x: torch.digamma(x), [P(3, 4)], aten.digamma),
    "deg2rad": (lambda x: torch.deg2rad(x), [R(3, 4)], aten.deg2rad),
    "rad2deg": (lambda x: torch.rad2deg(x), [R(3, 4)], aten.rad2deg),
    "logit": (lambda x: torch.logit(x * 0.5, eps=0.3), [P(3, 4)], aten.logit),
    "atan2": (lambda a, b: torch.atan2(a, b), [R(3, 4), R(4)], aten.atan2),
    "hypot": (lambda a, b: torch.hypot(a, b), [R(3, 4), R(3, 1)], aten.hypot),
    "logaddexp": (lambda a, b: torch.logaddexp(a, b), [R(3, 4), R(4)], aten.logaddexp),
    "xlogy": (lambda a, b: torch.xlogy(a * (torch.arange(4) != 1), b), [R(3, 4), P(3, 4)], aten.xlogy),
    "lerp": (lambda a, b, w: torch.lerp(a, b, w), [R(3, 4), R(4), R(3, 1)], aten.lerp),
    "lerp_scalar": (lambda a, b: torch.lerp(a, b, 0.3), [R(3, 4), R(3, 4)], aten.lerp),
    "celu": (lambda x: torch.nn.functional.celu(x, 0.7), [R(3, 4)], aten.celu),
    "threshold": (lambda x: torch.nn.functional.threshold(x, 0.1, 2.0), [R(3, 4)], aten.threshold),
    "logsigmoid": (lambda x: torch.nn.functional.logsigmoid(x), [R(3, 4)], aten.log_sigmoid_forward),
    "nansum": (lambda x: torch.nansum(torch.log(x - 1), 1), [P(3, 4)], aten.nansum),  # NaN where x < 1
    "vector_norm_2": (lambda x: torch.linalg.vector_norm(x, dim=1), [R(3, 4)], aten.linalg_vector_norm),
    "vector_norm_3_zero_row": (lambda x: torch.linalg.vector_norm(x * (torch.arange(3) != 1)[:, None], 3, 1),
                               [R(3, 4)], aten.linalg_vector_norm),
    "vector_norm_1": (lambda x: torch.linalg.vector_norm(x, 1), [R(3, 4)], aten.linalg_vector_norm),
    # more linear algebra
    "dot": (lambda a, b: torch.dot(a, b), [R(5), R(5)], aten.dot),
    "vdot": (lambda a, b: torch.vdot(a, b), [R(5), R(5)], aten.vdot),
    "mv": (lambda m, v: torch.mv(m, v), [R(3, 5), R(5)], aten.mv),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2), [R(3, 1), R(2, 3, 4), R(2, 4, 5)],
                aten.baddbmm),
    "addbmm": (lambda c, a, b: torch.addbmm(c, a, b, alpha=2), [R(3, 5), R(2, 3, 4), R(2, 4, 5)], aten.addbmm),
    "addmv": (lambda c, m, v: torch.addmv(c, m, v, beta=2), [R(3), R(3, 5), R(5)], aten.addmv),
    "addr": (lambda c, a, b: torch.addr(c, a, b, alpha=3), [R(3, 4), R(3), R(4)], aten.addr),
    "addcmul": (lambda x, a, b: torch.addcmul(x, a, b, value=0.5), [R(3, 4), R(4), R(3, 1)], aten.addcmul),
    "addcdiv": (lambda x, a, b: torch.addcdiv(x, a, b, value=0.5), [R(3, 4), R(4), P(3, 1)], aten.addcdiv),
    # more shape ops
    "transpose_copy": (lambda x: torch.transpose_copy(x, 0, 2), [R(2, 3, 4)], aten.transpose_copy),
    "view_copy": (lambda x: torch.view_copy(x, [4, 3]), [R(3, 4)], aten.view_copy),
    "unsqueeze_copy": (lambda x: torch.unsqueeze_copy(x, 1), [R(3, 4)], aten.unsqueeze_copy),
    "squeeze_copy": (lambda x: torch.squeeze_copy(x, 1), [R(3, 1, 4)], aten.squeeze_copy),
    "permute_copy": (lambda x: torch.permute_copy(x, [2, 0, 1]), [R(2, 3, 4)], aten.permute_copy),
    "expand_copy": (lambda x: torch.expand_copy(x, [2, 3, 4]), [R(3, 1)], aten.expand_copy),
    "alias_copy": (lambda x: torch.alias_copy(x) * 2, [R(3, 4)], aten.alias_copy),
    "t_copy": (lambda x: torch.t_copy(x), [R(3, 4)], aten.t_copy),
    "diagonal": (lambda x: torch.diagonal(x, 1, 0, 2), [R(3, 2, 4)], aten.diagonal),
    "diagonal_copy": (lambda x: torch.diagonal_copy(x, -1), [R(4, 3)], aten.diagonal_copy),
    "diag_embed": (lambda x: torch.diag_embed(x, 1), [R(2, 3)], aten.diag_embed),
    "unfold": (lambda x: x.unfold(1, 3, 2), [R(2, 7)], aten.unfold),
    "repeat": (lambda x: x.repeat(2, 1, 3), [R(3, 2)], aten.repeat),
    "pixel_shuffle": (lambda x: torch.nn.functional.pixel_shuffle(x, 2), [R(1, 8, 2, 3)], aten.pixel_shuffle),
    "pixel_unshuffle": (lambda x: torch.nn.functional.pixel_unshuffle(x, 2), [R(1, 2, 4, 6)],
                        aten.pixel_unshuffle),
    "rot90": (lambda x: torch.rot90(x, 3, [1, 2]), [R(2, 3, 4)], aten.rot90),
    "unsafe_split": (lambda x: torch.cat(torch.unsafe_split(x, 2, 1)[::-1], 1), [R(3, 5)], aten.unsafe_split),
    "unsafe_split_with_sizes": (lambda x: torch.unsafe_split_with_sizes(x, [1, 4], 1)[1], [R(3, 5)],
                                aten.unsafe_split_with_sizes),
    "split_with_sizes_copy": (lambda x: torch.split_with_sizes_copy(x, [2, 1], 0)[0], [R(3, 5)],
                              aten.split_with_sizes_copy),
    # losses
    "mse_loss": (lambda x, t: torch.nn.functional.mse_loss(x, t), [R(3, 4), R(3, 4)], aten.mse_loss),
    "smooth_l1_loss": (lambda x, t: torch.nn.functional.smooth_l1_loss(x, t, reduction="sum", beta=0.5),
                       [R(3, 4), R(3, 4)], aten.smooth_l1_loss),
    "huber_loss": (lambda x, t: torch.nn.functional.huber_loss(x, t, reduction="none", delta=0.7),
                   [R(3, 4), R(3, 4)], aten.huber_loss),
    "soft_margin_loss": (lambda x, t: torch.nn.functional.soft_margin_loss(x, t.sign()), [R(3, 4), ("noreq", (3, 4))],
                         aten.soft_margin_loss),
    "binary_cross_entropy": (lambda x, t: torch.nn.functional.binary_cross_entropy(torch.sigmoid(x), t),
                             [R(3, 4), ("unit", (3, 4))], aten.binary_cross_entropy),
    "nll_loss_weighted": (lambda x, t, w: torch.nn.functional.nll_loss(torch.log_softmax(x, 1), t, w),
                          [R(4, 3), I(3, 4), ("unit", (3,))], aten.nll_loss_forward),
    # more pooling, sampling, scatter-style writes
    "adaptive_max_pool2d": (lambda x: torch.nn.functional.adaptive_max_pool2d(x, (2, 3)), [R(2, 3, 5, 7)],
                            aten.adaptive_max_pool2d),
    "adaptive_max_pool3d": (lambda x: torch.nn.functional.adaptive_max_pool3d(x, 2), [R(1, 2, 4, 5, 3)],
                            aten.adaptive_max_pool3d),
    "avg_pool3d": (lambda x: torch.nn.functional.avg_pool3d(x, 2, 1), [R(1, 2, 3, 4, 3)], aten.avg_pool3d),
    "adaptive_avg_pool3d": (lambda x: torch.nn.functional.adaptive_avg_pool3d(x, 2), [R(1, 2, 3, 5, 4)],
                            aten._adaptive_avg_pool3d),
    "grid_sample": (lambda x, g: torch.nn.functional.grid_sample(x, torch.tanh(g), align_corners=False),
                    [R(1, 2, 4, 5), R(1, 3, 2, 2)], aten.grid_sampler_2d),
    "unfold_im2col": (lambda x: torch.nn.functional.unfold(x, 2, padding=1), [R(1, 2, 3, 4)], aten.im2col),
    "cdist": (lambda a, b: torch.cdist(a, b), [R(2, 3, 4), R(2, 5, 4)], aten._cdist_forward),
    "slice_scatter": (lambda x, s: torch.slice_scatter(x, s, 1, 1, 5, 2), [R(3, 6), R(3, 2)], aten.slice_scatter),
    "select_scatter": (lambda x, s: torch.select_scatter(x, s, 0, 1), [R(3, 4), R(4)], aten.select_scatter),
    "index_fill": (lambda x, i: torch.index_fill(x, 1, i, 2.0), [R(3, 5), I(5, 2)], aten.index_fill),
    "index_fill_tensor": (lambda x, i, v: torch.index_fill(x, 0, i, v.sum()), [R(4, 3), I(4, 2), R(2)],
                          aten.index_fill),
    "index_copy": (lambda x, s: torch.index_copy(x, 0, torch.tensor([2, 0]), s), [R(4, 3), R(2, 3)],
                   aten.index_copy),
    "polygamma": (lambda x: torch.polygamma(2, x), [P(3, 4)], aten.polygamma),
    "i0": (lambda x: torch.i0(x), [R(3, 4)], aten.i0),
    # odds and ends
    "fill": (lambda x, v: torch.fill(x * 2, v.sum()) * x, [R(3, 4), R(2)], aten.fill),
    "zero": (lambda x: torch.zero_(x * 2) + x, [R(3, 4)], aten.zero),
    "trace": (lambda x: torch.trace(x), [R(3, 4)], aten.trace),
    "take": (lambda x, i: torch.take(x, i - 4), [R(3, 4), I(12, 2, 5)], aten.take),
    "fmax": (lambda a, b: torch.fmax(a, b), [T(3, 4), T(4)], aten.fmax),
    "fmin": (lambda a, b: torch.fmin(a, b), [T(3, 4), T(3, 4)], aten.fmin),
    "remainder": (lambda a, b: torch.remainder(a, b), [R(3, 4), P(4)], aten.remainder),
    "fmod": (lambda a, b: torch.fmod(a, b), [R(3, 4), P(3, 1)], aten.fmod),
    "nan_to_num": (lambda x: torch.nan_to_num(torch.log(x - 1), posinf=2.0), [P(3, 4)], aten.nan_to_num),
    "prelu": (lambda x, w: torch.nn.functional.prelu(x, w), [R(2, 3, 4), R(3)], aten._prelu_kernel),
}

#: rules for CUDA-only kernels (the fused attention forms): checked on the GPU machine by
#: test_cuda_attention_vjp_rules below, listed here so the CPU run knows why they are absent
CUDA_ONLY = {aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_efficient_attention,
             aten._scaled_dot_product_cudnn_attention}

#: prims without a VJP rule, and why (training through them fails with a clear error).
NO_RULE: dict = {}


def _grads_compiled_vs_eager(name):
    fn, specs, _, *ref = CASES[name]
    torch.manual_seed(zlib.crc32(name.encode()))
    inputs = [_make(s) for s in specs]
    # batch norm's rules are for the ATen op, kept when the batch norm decomposition is off
    with config.patch({"decompose_batch_norm": False}):
        compiled = aot_eager(fn, inputs)
    expected = (ref[0] if ref else fn)(*inputs)
    actual = compiled(*inputs)
    torch.testing.assert_close(actual, expected)
    weights = torch.randn_like(expected)  # a non-trivial tangent
    diff = [x for x in inputs if x.requires_grad]
    want = torch.autograd.grad((expected * weights).sum(), diff, allow_unused=True)
    got = torch.autograd.grad((actual * weights).sum(), diff, allow_unused=True)
    return compiled, want, got


@pytest.mark.parametrize("name", sorted(CASES))
def test_vjp_rule_matches_eager(name):
    compiled, want, got = _grads_compiled_vs_eager(name)
    op = CASES[name][2]
    targets = {getattr(n.target, "overloadpacket", n.target) for n in compiled.aot.prim_gm.graph.nodes}
    assert op in targets, f"case {name} does not exercise {op}"
    for w, g in zip(want, got):
        if w is None:
            assert g is None or torch.count_nonzero(g) == 0
        else:
            torch.testing.assert_close(g, w)


def test_every_prim_has_a_rule_or_a_reason():
    missing = {op for op in PRIM_SET if op not in VJP_RULES} - set(NO_RULE)
    assert not missing, f"prims without VJP rules: {sorted(map(str, missing))}"


def test_every_rule_is_tested():
    tested = {case[2] for case in CASES.values()}
    silent = {aten.eq, aten.ne, aten.lt, aten.le, aten.logical_and, aten.logical_or, aten.logical_not,
              aten.alias, aten.arange, aten.empty}  # exercised inside other cases
    untested = set(VJP_RULES) - tested - silent - CUDA_ONLY
    assert not untested, f"VJP rules without a test case: {sorted(map(str, untested))}"


@pytest.mark.parametrize("grad_shape, shape", [((2, 3, 4), (4,)), ((2, 3, 4), (3, 1)), ((2, 3, 4), (1, 1, 1)),
                                               ((2, 3), (2, 3)), ((5,), ())])
def test_sum_to_size_matches_autograd(grad_shape, shape):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(grad_shape, dtype=torch.float64)
    (want,) = torch.autograd.grad(x.expand(grad_shape), x, grad)
    torch.testing.assert_close(sum_to_size(grad, x), want)
    assert sum_to_size(grad, 2.0) is None


def test_missing_rule_names_the_op():
    """An op a gradient must pass through, without a rule: a compile error naming the op."""
    from tininductor.decompositions import decompose, fake_inputs
    from tininductor.joint_graph import MissingVJPRule, create_joint

    x = torch.randn(2, 3, requires_grad=True)
    rules = {k: v for k, v in VJP_RULES.items() if k is not aten.cumprod}  # a registry lacking cumprod
    fn = lambda x: torch.cumprod(x.exp(), 1)  # noqa: E731
    fakes, mode = fake_inputs([x])
    with pytest.raises(MissingVJPRule, match="no VJP rule for aten.cumprod"):
        create_joint(decompose(fn, fakes), fakes, [True], mode, rules=rules)
