"""int8 conv (groups 1, C % 4 == 0) on kernels_vnni with its images as C/4 planes of words, four
channels a word (kernels_vnni.pad_quad): read in place by gemm_quad where the packed columns
would be at the pitch of Wp anyway, else packed from the planes by the pixel table
(pack_quad_cols: a word a column, not four bytes)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_pool as kp
from pocket.infer import kernels_vnni as kv
from pocket.infer import lowering_common as lc
from pocket.infer.lowering_common import _aligned, _tile_cols
from pocket.infer.routes.base import Route, prepared, register
from pocket.infer.routes.conv_vnni import vnni_limits, vnni_prep


def quad_prep(d: dict, c: int, in_place: bool, max_batch: int, budget: int) -> dict:
    """In place on narrow maps, each image's pixels in whole vectors cost more than packing
    saves (cnn_cifar int8 at batch 64: 52.1 ms, 48.1 with those packed by pack_cols).
    Scratch: the weights in gemm_quad's order, the planes of a chunk of images, [its packed
    columns,] its sums."""
    kh, kw, _, _, ph, pw, dh, dw = d["geom"]
    hp, wp, o, k = d["hp"], d["wp"], d["o"], d["k"]
    img = c // 4 * hp * wp
    offs = kv.quad_offsets(c, hp, wp, kh, kw, dh, dw)
    if in_place:
        pix = d["ho"] * wp
        q = {"pix": pix, "cpi": _tile_cols(pix), "img": img, "offs": offs, "in_place": True}
        # an image's whole last vector, and the window past its last pixel, read past the planes
        q["slack"] = q["cpi"] - pix + (kw - 1) * dw + 1
        per_image = 4 * img + 4 * o * q["cpi"]
    else:
        q = {"pix": d["pix"], "img": img, "koffs": offs // 4, "in_place": False,
             "slack": (kw - 1) * dw + 1}  # a window past the last row's end, at stride 1
        per_image = 4 * img + (k + 4 * o) * d["pix"]
    q["chunk"] = max(1, min(max_batch, budget // per_image))
    cols = q["chunk"] * q["cpi"] if in_place else _tile_cols(q["chunk"] * d["pix"])
    q["wq_bytes"] = 0  # the weights in gemm_quad's order are prepared once (bind)
    q["xq_bytes"] = _aligned(4 * (q["chunk"] * q["img"] + q["slack"]))
    q["xp_bytes"] = 0 if in_place else _aligned(k * cols)  # K/4 rows of cols words
    q["scratch_bytes"] = q["wq_bytes"] + q["xq_bytes"] + q["xp_bytes"] + _aligned(4 * o * cols)
    return q


def _pack_quad(w: np.ndarray, o: int, k: int) -> np.ndarray:
    wq = np.empty((o, k), np.int8)
    kv.pack_weights_quad.serial(wq, w)
    return wq


@register
class ConvVnniQuad(Route):
    name, op = "conv_vnni_quad", "conv2d"
    fuses_pool = True

    def limits(self, geo, dtype, cpu):
        return vnni_limits(geo, dtype, cpu) or (None if geo.c % 4 == 0 else "needs C % 4 == 0")

    def prepare(self, ctx, node):
        d = vnni_prep(ctx, node, self.name)
        c = d["geo"].c
        d["quad"] = q = quad_prep(d, c, d["flat"], ctx.max_batch, lc.VNNI_SCRATCH_BYTES * ctx.threads)
        d["scratch_bytes"] = max(d["scratch_bytes"], q["scratch_bytes"])
        return d

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        pool, pool_geom = pool or (None, ())
        q, o, k = d["quad"], d["o"], d["k"]
        kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
        epi = (d["bias_u8"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
        # NOTE: packed once (routes.base.prepared), not per call: 0.38 ms of MobileNetV2-0.5's
        # 2.1 ms int8 batch 1 was this repacking
        wq = prepared(d, "wq", lambda: _pack_quad(d["w"], o, k))
        calls = []
        pitch = d["wp"] if q["in_place"] else d["pitch"]
        for start in range(0, n, q["chunk"]):
            m = min(q["chunk"], n - start)
            xq = ctx.scratch(step, np.uint32, (m * q["img"] + q["slack"],), q["wq_bytes"])
            at = q["wq_bytes"] + q["xq_bytes"]
            calls.append(partial(kv.pad_quad, xq, x[start:start + m], ph, pw, d["hp"], d["wp"],
                                 a["x_zero_point"] + 128))
            if q["in_place"]:
                istride = q["cpi"]
                c = ctx.scratch(step, np.int32, (o, m * istride), at)
                calls.append(partial(kv.gemm_quad, c, wq, xq, q["offs"], m, istride, q["img"]))
            else:
                istride, cols = q["pix"], _tile_cols(m * q["pix"])
                xp = ctx.scratch(step, np.uint32, (k // 4, cols), at)
                c = ctx.scratch(step, np.int32, (o, cols), at + q["xp_bytes"])
                calls += [partial(kv.pack_quad_cols, xp, xq, m, q["img"], q["koffs"], q["pix"], d["poffs"]),
                          partial(kv.gemm_cols, c, wq, xp)]
            calls.append(partial(kv.requant_cols, y[start:start + m], c, c.view(np.float32), pitch, istride,
                                 *epi)
                         if pool is None else
                         partial(kp.requant_cols_pool, pool[start:start + m], c, c.view(np.float32), d["ho"],
                                 pitch, istride, *pool_geom, *epi))
        return calls
