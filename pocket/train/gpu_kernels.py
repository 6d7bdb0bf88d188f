"""The CUDA sources pocket builds, each with its NumPy twin (no CuPy here: backend.py compiles).

One RawModule source holds every kernel as a template over the element type (`half_t`,
`float`, `double`); `INSTANCES` lists the instantiations the trainer launches, so the NVRTC
test (tests/train/test_nvrtc.py) compiles exactly what a real run compiles, for every
architecture. Half values are 16-bit storage converted to and from float with PTX `cvt`, which
every architecture from sm_52 has; the arithmetic is in float (double for fp64).

A twin takes the launch's (grid, block) and the same arguments as the kernel (NumPy arrays
for device pointers, NumPy scalars for values) and writes the outputs in place: it is what the
test suite's CuPy stand-in runs, and what the kernels are tested against.

Elementwise kernels use a grid-stride loop, so any grid size covers any n.
"""

from __future__ import annotations

import numpy as np

SOURCE = r"""
// No headers: fp16 is stored as 16 bits and converted with PTX cvt, which every architecture
// has (cuda_fp16.h's __half arithmetic needs sm_53, and the header is not on every NVRTC path).
struct half_t { unsigned short bits; };

typedef long long i64;
typedef unsigned long long u64;

template <typename T> struct acc_of { typedef float type; };
template <> struct acc_of<double> { typedef double type; };

__device__ __forceinline__ float to_acc(half_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
    return f;
}
__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }

template <typename T> __device__ __forceinline__ T from_acc(typename acc_of<T>::type x);
template <> __device__ __forceinline__ half_t from_acc<half_t>(float x) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(x));
    return h;
}
template <> __device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_acc<double>(double x) { return x; }

#define GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

template <typename T>
__global__ void relu_backward(const T* gy, const T* y, T* gx, i64 n) {
    GRID_STRIDE(i, n) { gx[i] = to_acc(y[i]) > 0 ? gy[i] : from_acc<T>(0); }
}

// erf in the input's own type (fp16 through float): GELU must not leave the compute dtype.
template <typename T>
__global__ void erf_forward(const T* x, T* y, i64 n) {
    GRID_STRIDE(i, n) { y[i] = from_acc<T>(erf(to_acc(x[i]))); }
}

// Counter-based dropout: element i keeps iff uniform(seed, i) >= p; no generator state, so
// one seed drawn from the pocket RNG per call makes a run reproducible and resumable.
__device__ __forceinline__ u64 splitmix64(u64 z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

template <typename T>
__global__ void dropout_mask(u64 seed, float p, float scale, T* mask, i64 n) {
    GRID_STRIDE(i, n) {
        float u = (float)(splitmix64(seed ^ (u64)i) >> 40) * (1.0f / 16777216.0f);
        mask[i] = from_acc<T>(u >= p ? scale : 0.0f);
    }
}

// flags: 1 nesterov, 2 first step (buffer = d), 4 decoupled decay, 8 momentum
template <typename T>
__global__ void sgd_step(T* p, const T* g, T* buf, i64 n, T lr, T wd, T mom, T damp, int flags) {
    GRID_STRIDE(i, n) {
        T x = p[i];
        T d = g[i];
        if (flags & 4) x -= lr * wd * x; else d += wd * x;
        if (flags & 8) {
            T b = (flags & 2) ? d : mom * buf[i] + (1 - damp) * d;
            buf[i] = b;
            d = (flags & 1) ? d + mom * b : b;
        }
        p[i] = x - lr * d;
    }
}

template <typename T>
__global__ void adam_step(T* p, const T* g, T* m, T* v, i64 n, T lr, T b1, T b2, T eps, T wd,
                          T bc1, T bc2, int decoupled) {
    GRID_STRIDE(i, n) {
        T x = p[i];
        T d = g[i];
        if (decoupled) x -= lr * wd * x; else d += wd * x;
        T mi = b1 * m[i] + (1 - b1) * d;
        T vi = b2 * v[i] + (1 - b2) * d * d;
        m[i] = mi;
        v[i] = vi;
        p[i] = x - lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
    }
}

// x (N, C, H, W) -> col (C, kh, kw, N, Ho, Wo), zeros where a tap falls in the padding
template <typename T>
__global__ void im2col(const T* x, T* col, int N, int C, int H, int W, int kh, int kw, int sh,
                       int sw, int ph, int pw, int dh, int dw, int Ho, int Wo) {
    i64 total = (i64)C * kh * kw * N * Ho * Wo;
    GRID_STRIDE(idx, total) {
        i64 r = idx;
        int ow = r % Wo; r /= Wo;
        int oh = r % Ho; r /= Ho;
        int n = r % N; r /= N;
        int j = r % kw; r /= kw;
        int i = r % kh; r /= kh;
        int c = (int)r;
        int h = oh * sh - ph + i * dh, w = ow * sw - pw + j * dw;
        col[idx] = (h >= 0 && h < H && w >= 0 && w < W)
            ? x[(((i64)n * C + c) * H + h) * W + w] : from_acc<T>(0);
    }
}

// col (C, kh, kw, N, Ho, Wo) -> gx (N, C, H, W): each input element gathers the taps that read
// it (no atomics, deterministic), summed in the accumulation type
template <typename T>
__global__ void col2im(const T* col, T* gx, int N, int C, int H, int W, int kh, int kw, int sh,
                       int sw, int ph, int pw, int dh, int dw, int Ho, int Wo) {
    i64 total = (i64)N * C * H * W;
    GRID_STRIDE(idx, total) {
        i64 r = idx;
        int w = r % W; r /= W;
        int h = r % H; r /= H;
        int c = r % C; r /= C;
        int n = (int)r;
        typename acc_of<T>::type acc = 0;
        for (int i = 0; i < kh; ++i) {
            int th = h + ph - i * dh;
            if (th < 0 || th % sh) continue;
            int oh = th / sh;
            if (oh >= Ho) continue;
            for (int j = 0; j < kw; ++j) {
                int tw = w + pw - j * dw;
                if (tw < 0 || tw % sw) continue;
                int ow = tw / sw;
                if (ow >= Wo) continue;
                acc += to_acc(col[((((i64)c * kh + i) * kw + j) * N + n) * Ho * Wo + (i64)oh * Wo + ow]);
            }
        }
        gx[idx] = from_acc<T>(acc);
    }
}
"""

_TYPES = {"half_t": np.float16, "float": np.float32, "double": np.float64}
_KERNEL_TYPES = {
    "relu_backward": ("half_t", "float", "double"),
    "erf_forward": ("half_t", "float", "double"),
    "dropout_mask": ("half_t", "float", "double"),
    "sgd_step": ("float", "double"),  # the optimizer updates fp32 masters (fp64 in fp64 runs)
    "adam_step": ("float", "double"),
    "im2col": ("half_t", "float", "double"),
    "col2im": ("half_t", "float", "double"),
}
INSTANCES = [f"{k}<{t}>" for k, ts in _KERNEL_TYPES.items() for t in ts]
CTYPE = {np.dtype(v): k for k, v in _TYPES.items()}
OPTIONS = ("-std=c++14",)
BLOCK = 256
MAX_GRID = 65535 * 8


def instance(name: str, dtype) -> str:
    """The name expression of `name` for arrays of `dtype` (raises for one not instantiated)."""
    expr = f"{name}<{CTYPE[np.dtype(dtype)]}>"
    if expr not in INSTANCES:
        raise TypeError(f"GPU kernel {name} has no {np.dtype(dtype)} instance")
    return expr


def launch_shape(n: int) -> tuple[tuple[int], tuple[int]]:
    return (max(1, min(MAX_GRID, (int(n) + BLOCK - 1) // BLOCK)),), (BLOCK,)


# ----------------------------------------------------------------------------- NumPy twins


def _acc(a):
    return a.astype(np.float32) if a.dtype == np.float16 else a


def _flat(*arrays):
    return [a.reshape(-1) for a in arrays]


def relu_backward(grid, block, gy, y, gx, n):
    gy, y, gx = _flat(gy, y, gx)
    gx[:n] = np.where(_acc(y[:n]) > 0, gy[:n], 0).astype(gx.dtype)


def erf_forward(grid, block, x, y, n):
    from pocket.train.kernels_cpu import erf

    x, y = _flat(x, y)
    y[:n] = erf(_acc(x[:n])).astype(y.dtype)


_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(
    0x9E3779B97F4A7C15)


def splitmix64(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = z + _GOLD
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def dropout_uniform(seed, n: int) -> np.ndarray:
    """The kernel's uniforms in [0, 1) as float32 (24 random bits, exact in float32)."""
    z = splitmix64(np.uint64(seed) ^ np.arange(n, dtype=np.uint64))
    return (z >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def dropout_mask(grid, block, seed, p, scale, mask, n):
    (mask,) = _flat(mask)
    u = dropout_uniform(seed, n)
    mask[:n] = np.where(u >= np.float32(p), np.float32(scale), np.float32(0)).astype(mask.dtype)


def sgd_step(grid, block, p, g, buf, n, lr, wd, mom, damp, flags):
    p, g, buf = _flat(p, g, buf)
    x, d = p[:n].copy(), g[:n].copy()
    if flags & 4:
        x -= lr * wd * x
    else:
        d += wd * x
    if flags & 8:
        b = d.copy() if flags & 2 else mom * buf[:n] + (1 - damp) * d
        buf[:n] = b
        d = d + mom * b if flags & 1 else b
    p[:n] = x - lr * d


def adam_step(grid, block, p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, decoupled):
    p, g, m, v = _flat(p, g, m, v)
    x, d = p[:n].copy(), g[:n].copy()
    if decoupled:
        x -= lr * wd * x
    else:
        d += wd * x
    m[:n] = b1 * m[:n] + (1 - b1) * d
    v[:n] = b2 * v[:n] + (1 - b2) * d * d
    p[:n] = x - lr * (m[:n] / bc1) / (np.sqrt(v[:n] / bc2) + eps)


def im2col(grid, block, x, col, N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo):
    xs = x.reshape(N, C, H, W)
    cs = col.reshape(C, kh, kw, N, Ho, Wo)
    xpad = np.zeros((N, C, H + 2 * ph, W + 2 * pw), x.dtype)
    xpad[:, :, ph:ph + H, pw:pw + W] = xs
    for i in range(kh):
        for j in range(kw):
            h0, w0 = i * dh, j * dw
            tap = xpad[:, :, h0:h0 + sh * (Ho - 1) + 1:sh, w0:w0 + sw * (Wo - 1) + 1:sw]
            cs[:, i, j] = tap.transpose(1, 0, 2, 3)


def col2im(grid, block, col, gx, N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo):
    cs = _acc(col.reshape(C, kh, kw, N, Ho, Wo))
    gpad = np.zeros((N, C, H + 2 * ph, W + 2 * pw), cs.dtype)
    for i in range(kh):
        for j in range(kw):
            h0, w0 = i * dh, j * dw
            gpad[:, :, h0:h0 + sh * (Ho - 1) + 1:sh, w0:w0 + sw * (Wo - 1) + 1:sw] += (
                cs[:, i, j].transpose(1, 0, 2, 3))
    gx.reshape(N, C, H, W)[...] = gpad[:, :, ph:ph + H, pw:pw + W]


TWINS = {"relu_backward": relu_backward, "erf_forward": erf_forward,
         "dropout_mask": dropout_mask, "sgd_step": sgd_step, "adam_step": adam_step,
         "im2col": im2col, "col2im": col2im}
