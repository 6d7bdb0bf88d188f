"""Numba kernels of the spiking ops: spike_encode and lif (see pocket/formats/ops_spiking.py).

One call runs one lif node over a batch: samples in parallel (prange), each sample's T steps in
order with its membrane v in scratch. The synaptic sums are float64 (exact for 0/1 spikes and
for int8 weights, and rounded to float32 once, as formats/reference.py does), then the neurons
step in float32 exactly as the op defines them, so the spikes match the reference's.

Event-driven synapses (`sparse`): a spike is 0 or 1, so a time step's current is the sum of the
weight columns of the inputs that fired: the linear kernel walks those inputs only (weights
transposed at load to (K, O): each spike adds one contiguous row), the conv kernel scatters
each input spike's kernel window into the outputs it reaches. The work falls with the firing
rate; dense loops do every multiply-add. bench/spiking.py measures the two; lowering_spiking
picks event-driven for inputs that are spikes (the output of a lif or a rate/latency encoder).
An input that is the same at every step (a direct-current encoder's) has its currents computed
at step 0 only (`const_t`): T times less synaptic work for the first layer.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from pocket.infer.jit import kernel

MODE_SPIKES, MODE_COUNT, MODE_MEMBRANE = 0, 1, 2


@njit(cache=True, inline="always")
def _step(out, n, t, cur, v, decay, thr, subtract, mode):
    # cur (F,) float32 currents of step t -> out (N, T or 1, F); v (F,) the membranes
    for f in range(cur.shape[0]):
        u = decay * v[f] + cur[f]
        if mode == 2:  # membrane readout: no threshold; out holds the running sum
            v[f] = u
            out[n, 0, f] += u
            continue
        fire = u >= thr
        if fire:
            v[f] = u - thr if subtract else np.float32(0.0)
        else:
            v[f] = u
        s = np.float32(1.0) if fire else np.float32(0.0)
        if mode == 0:
            out[n, t, f] = s
        else:
            out[n, 0, f] += s


@njit(cache=True, inline="always")
def _zero(a):
    # NOTE: a loop, not `a[:] = 0`: inside a prange body an array expression becomes a nested
    # parfor, which cost the parallel twin several times the serial one's time (measured)
    flat = a.reshape(-1)
    for i in range(flat.shape[0]):
        flat[i] = 0


@njit(cache=True, inline="always")
def _finish(out, n, steps, mode):
    if mode == 2:
        inv = np.float32(steps)
        for f in range(out.shape[2]):
            out[n, 0, f] = out[n, 0, f] / inv


@kernel
def lif_none(out, x, v, cur, decay, thr, subtract, mode):
    # x (N, T, F) currents -> out (N, T|1, F); v, cur (N, F) scratch
    for n in prange(x.shape[0]):
        _zero(v[n])
        _zero(out[n])
        for t in range(x.shape[1]):
            for f in range(x.shape[2]):
                cur[n, f] = x[n, t, f]
            _step(out, n, t, cur[n], v[n], decay, thr, subtract, mode)
        _finish(out, n, x.shape[1], mode)


@kernel
def lif_linear(out, x, w, wt, scale, b, v, cur, acc, decay, thr, subtract, mode, sparse, const_t):
    # x (N, T, K), w (O, K), wt (K, O) (w transposed, for events), scale (O,) f64, b (O,) f64
    # -> out (N, T|1, O); v, cur (N, O) f32 and acc (N, O) f64 scratch
    steps, k_in, o_out = x.shape[1], x.shape[2], w.shape[0]
    for n in prange(x.shape[0]):
        _zero(v[n])
        _zero(out[n])
        a = acc[n]
        for t in range(steps):
            if const_t and t > 0:  # the same input at every step: the same currents
                _step(out, n, t, cur[n], v[n], decay, thr, subtract, mode)
                continue
            _zero(a)
            xt = x[n, t]
            if sparse:
                for k in range(k_in):
                    xk = xt[k]
                    if xk != 0:
                        row = wt[k]
                        for o in range(o_out):
                            a[o] += np.float64(xk) * np.float64(row[o])
            else:
                for o in range(o_out):
                    s = 0.0
                    wo = w[o]
                    for k in range(k_in):
                        s += np.float64(xt[k]) * np.float64(wo[k])
                    a[o] = s
            for o in range(o_out):
                cur[n, o] = np.float32(a[o] * scale[o] + b[o])
            _step(out, n, t, cur[n], v[n], decay, thr, subtract, mode)
        _finish(out, n, steps, mode)


@kernel
def lif_conv(out, x, w, scale, b, v, cur, acc, sh, sw, ph, pw, decay, thr, subtract, mode,
             sparse, const_t):
    # x (N, T, C, H, W), w (O, C, kh, kw), scale/b (O,) f64 -> out (N, T|1, O*Ho*Wo);
    # v, cur (N, O*Ho*Wo) f32 and acc (N, O, Ho, Wo) f64 scratch
    steps, c_in, h, wd = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    o_out, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    ho, wo = acc.shape[2], acc.shape[3]
    for n in prange(x.shape[0]):
        _zero(v[n])
        _zero(out[n])
        a = acc[n]
        for t in range(steps):
            if const_t and t > 0:
                _step(out, n, t, cur[n], v[n], decay, thr, subtract, mode)
                continue
            _zero(a)
            xt = x[n, t]
            if sparse:  # scatter each input spike into the outputs whose window holds it
                for c in range(c_in):
                    for iy in range(h):
                        for ix in range(wd):
                            xv = xt[c, iy, ix]
                            if xv == 0:
                                continue
                            for i in range(kh):
                                ny = iy + ph - i
                                if ny < 0 or ny % sh != 0 or ny // sh >= ho:
                                    continue
                                oy = ny // sh
                                for j in range(kw):
                                    nx = ix + pw - j
                                    if nx < 0 or nx % sw != 0 or nx // sw >= wo:
                                        continue
                                    ox = nx // sw
                                    for o in range(o_out):
                                        a[o, oy, ox] += np.float64(xv) * np.float64(w[o, c, i, j])
            else:
                for o in range(o_out):
                    for oy in range(ho):
                        for ox in range(wo):
                            s = 0.0
                            for c in range(c_in):
                                for i in range(kh):
                                    iy = oy * sh - ph + i
                                    if iy < 0 or iy >= h:
                                        continue
                                    for j in range(kw):
                                        ix = ox * sw - pw + j
                                        if 0 <= ix < wd:
                                            s += np.float64(xt[c, iy, ix]) * np.float64(w[o, c, i, j])
                            a[o, oy, ox] = s
            f = 0
            for o in range(o_out):
                for oy in range(ho):
                    for ox in range(wo):
                        cur[n, f] = np.float32(a[o, oy, ox] * scale[o] + b[o])
                        f += 1
            _step(out, n, t, cur[n], v[n], decay, thr, subtract, mode)
        _finish(out, n, steps, mode)


@kernel
def encode(out, x, noise, mode, gain, offset):
    # x (N, F) -> out (N, T, F); mode 0 direct, 1 rate (noise (T, F)), 2 latency
    steps = out.shape[1]
    for n in prange(x.shape[0]):
        for t in range(steps):
            for f in range(x.shape[1]):
                xv = x[n, f]
                if mode == 0:
                    out[n, t, f] = xv
                    continue
                p = min(max(xv * gain + offset, np.float32(0.0)), np.float32(1.0))
                if mode == 1:
                    fire = noise[t, f] < p
                else:
                    when = np.floor((np.float32(1.0) - p) * np.float32(steps - 1) + np.float32(0.5))
                    fire = p > 0 and when == np.float32(t)
                out[n, t, f] = np.float32(1.0) if fire else np.float32(0.0)
