"""The edge zoo: the architectures people deploy on small devices, each as in its paper (and as
torchvision builds it, so parameter counts match at the ImageNet configuration), built from
plain layers and `Block` (train/nn_block.py) so the tracer turns each into the graph IR.

    resnet18            He et al., 2016
    squeezenet          Iandola et al., 2016 (version 1.1)
    mobilenet_v2        Sandler et al., 2018
    mobilenet_v3_small  Howard et al., 2019
    shufflenet_v2       Ma et al., 2018
    efficientnet_b0     Tan & Le, 2019

Small inputs. The papers downsample 224x224 by 32. For an input under 64 pixels on its short
side (digits 8x8, CIFAR 32x32) the stem's stride-2 steps become stride 1 and a stem max pool is
dropped (the CIFAR variants do the same); then any later stride-2 step that would start on a
feature map under 4 pixels runs at stride 1 (a pool there is dropped), so the last map stays at
least 2x2 where the input allows. Kernel sizes, channels and parameter counts never change; at
64 pixels and above every stride is the paper's.

A model's keyword-only arguments are its [model] options (e.g. `width_mult = 0.5`); `dropout`
is the config's (0 unless set; the papers use 0.2, 0.5 for SqueezeNet).
"""

from __future__ import annotations

import math

from pocket.train import models, nn
from pocket.train.nn_block import Block

# --------------------------------------------------------------------------- shapes and strides


class _Plan:
    """The feature map's (H, W) while a model is built: decides each stride-2 step and checks
    that nothing empties the map."""

    def __init__(self, name: str, input_shape):
        self.name = name
        self.hw = tuple(int(d) for d in input_shape[1:])
        self.small = min(self.hw) < 64

    def stride(self, s: int, stem: bool = False) -> int:
        if s == 1 or (stem and self.small) or min(self.hw) < 4:
            return 1
        return s

    def step(self, k: int, s: int, p: int) -> None:
        self.hw = tuple((d + 2 * p - k) // s + 1 for d in self.hw)
        if min(self.hw) < 1:
            raise models.ModelError(f"{self.name}: the input is too small for this model "
                                    f"(a {k}x{k} layer would leave an empty map)")


def make_divisible(v: float, divisor: int = 8) -> int:
    """Round channels to a multiple of `divisor`, never below 90% of v (the rule of the
    MobileNet reference code, which torchvision and the paper counts use)."""
    out = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * v else out


def _conv_bn(plan: _Plan, c_in: int, c_out: int, k: int, s: int, act, rng, *, groups: int = 1,
             eps: float = 1e-5, stem: bool = False) -> list[nn.Module]:
    """conv(k, stride s, 'same' padding, no bias) - BN - act (a layer class or None)."""
    s, p = plan.stride(s, stem), (k - 1) // 2
    plan.step(k, s, p)
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, k, s, p, groups=groups, bias=False, rng=rng),
                               nn.BatchNorm2d(c_out, eps)]
    return layers + ([act()] if act is not None else [])


def _head(c_in: int, num_outputs: int, dropout: float, rng, hidden: list | None = None,
          act=None) -> list[nn.Module]:
    """global average pool - flatten - [linear - act]* - dropout - linear."""
    layers: list[nn.Module] = [nn.GlobalAvgPool2d(), nn.Flatten()]
    for h in hidden or []:
        layers += [nn.Linear(c_in, h, rng=rng), act()]
        c_in = h
    if dropout:
        layers.append(nn.Dropout(dropout))
    return layers + [nn.Linear(c_in, num_outputs, rng=rng)]


def _relu6():
    return nn.ReLU6()


def _multiplier(v, key: str, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 4:
        raise models.ModelError(f"[model] {key} must be a number in (0, 4] for {name}, "
                                f"got {v!r}")
    return float(v)


def _scaled(c: int, width_mult: float, name: str) -> int:
    return make_divisible(c * _multiplier(width_mult, "width_mult", name))


# --------------------------------------------------------------------------- ResNet-18


@models.register_model("resnet18", input_rank=3)
def resnet18(input_shape, num_outputs, *, channels=None, dropout=0.0, rng=None, **_):
    """ResNet-18 (He et al., 2016, "Deep Residual Learning for Image Recognition", table 1):
    a 7x7/2 conv stem and a 3x3/2 max pool, four stages of two basic blocks at channels
    64-128-256-512 (`channels` to change them), stride 2 and a 1x1 projection at the start of
    stages 2-4, global average pool, linear head. 11.69M parameters with 1000 classes."""
    channels = list(channels or [64, 128, 256, 512])
    if len(channels) != 4:
        raise models.ModelError(f"resnet18 has four stages: give four channels, got {channels}")
    plan = _Plan("resnet18", input_shape)
    layers = _conv_bn(plan, input_shape[0], channels[0], 7, 2, nn.ReLU, rng, stem=True)
    s = plan.stride(2, stem=True)
    if s == 2:
        plan.step(3, 2, 1)
        layers.append(nn.MaxPool2d(3, 2, 1))
    c_in = channels[0]
    for i, c in enumerate(channels):
        for b in range(2):
            s = plan.stride(2) if (i > 0 and b == 0) else 1
            plan.step(3, s, 1)
            layers.append(nn.ResidualBlock(c_in, c, s, rng=rng))
            c_in = c
    return nn.Sequential(*layers, *_head(c_in, num_outputs, dropout, rng))


# --------------------------------------------------------------------------- SqueezeNet 1.1


def fire(c_in: int, squeeze: int, expand: int, rng) -> nn.Sequential:
    """SqueezeNet's fire module: a 1x1 squeeze conv, then 1x1 and 3x3 expand convs side by side
    (each `expand` channels, with ReLU), concatenated."""
    return nn.Sequential(
        nn.Conv2d(c_in, squeeze, 1, rng=rng), nn.ReLU(),
        Block([[nn.Conv2d(squeeze, expand, 1, rng=rng), nn.ReLU()],
               [nn.Conv2d(squeeze, expand, 3, padding=1, rng=rng), nn.ReLU()]], "concat"))


@models.register_model("squeezenet", input_rank=3)
def squeezenet(input_shape, num_outputs, *, width_mult: float = 1.0, dropout=0.0, rng=None,
               **_):
    """SqueezeNet 1.1 (Iandola et al., 2016, "SqueezeNet: AlexNet-level accuracy with 50x fewer
    parameters", and the 1.1 revision of its reference code): a 3x3/2 conv stem with 64
    channels, eight fire modules with 3x3/2 max pools after the stem and after fires 2 and 4,
    then a 1x1 conv classifier with ReLU and a global average pool. 1.235M parameters with 1000
    classes. `width_mult` scales every conv's channels. The reference pools round up (ceil
    mode); at 224x224 every map has an odd size there, so these (floor) pools give the same
    shapes."""
    def w(c):
        return _scaled(c, width_mult, "squeezenet")

    plan = _Plan("squeezenet", input_shape)
    s = plan.stride(2, stem=True)
    plan.step(3, s, 0)
    layers: list[nn.Module] = [nn.Conv2d(input_shape[0], w(64), 3, s, rng=rng), nn.ReLU()]
    c_in = w(64)

    def pool(stem=False):
        if plan.stride(2, stem) == 2:
            plan.step(3, 2, 0)
            layers.append(nn.MaxPool2d(3, 2))

    pool(stem=True)
    for i, (sq, ex) in enumerate([(16, 64), (16, 64), (32, 128), (32, 128), (48, 192),
                                  (48, 192), (64, 256), (64, 256)]):
        if i in (2, 4):
            pool()
        layers.append(fire(c_in, w(sq), w(ex), rng))
        c_in = 2 * w(ex)
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers += [nn.Conv2d(c_in, num_outputs, 1, rng=rng), nn.ReLU(), nn.GlobalAvgPool2d(),
               nn.Flatten()]
    return nn.Sequential(*layers)


# --------------------------------------------------------------------------- MobileNetV2


def inverted_residual(plan: _Plan, c_in: int, c_out: int, stride: int, expand: int, rng, *,
                      kernel: int = 3, act=_relu6, se: nn.Module | None = None,
                      eps: float = 1e-5) -> nn.Module:
    """MobileNetV2's inverted residual (with a linear bottleneck), also MobileNetV3's and
    EfficientNet's MBConv: 1x1 expand (skipped when `expand` == c_in) - depthwise kxk -
    [squeeze-and-excitation] - 1x1 project without activation; the input is added back when
    the stride is 1 and the channels match."""
    layers = [] if expand == c_in else _conv_bn(plan, c_in, expand, 1, 1, act, rng, eps=eps)
    s = plan.stride(stride)
    layers += _conv_bn(plan, expand, expand, kernel, s, act, rng, groups=expand, eps=eps)
    if se is not None:
        layers.append(se)
    layers += _conv_bn(plan, expand, c_out, 1, 1, None, rng, eps=eps)
    if s == 1 and c_in == c_out:
        return Block([layers, []], "add")
    return nn.Sequential(*layers)


@models.register_model("mobilenet_v2", input_rank=3)
def mobilenet_v2(input_shape, num_outputs, *, width_mult: float = 1.0, dropout=0.0, rng=None,
                 **_):
    """MobileNetV2 (Sandler et al., 2018, "MobileNetV2: Inverted Residuals and Linear
    Bottlenecks", table 2): a 3x3/2 conv stem, 17 inverted residuals with ReLU6 and linear
    bottlenecks, a 1x1 conv to 1280, global average pool, linear head. `width_mult` scales
    every width (rounded to multiples of 8; the last conv never narrows below 1280); the
    input size is the data's. 3.50M parameters at 1.0 with 1000 classes."""
    plan = _Plan("mobilenet_v2", input_shape)
    c_in = _scaled(32, width_mult, "mobilenet_v2")
    layers = _conv_bn(plan, input_shape[0], c_in, 3, 2, _relu6, rng, stem=True)
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        c_out = _scaled(c, width_mult, "mobilenet_v2")
        for i in range(n):
            layers.append(inverted_residual(plan, c_in, c_out, s if i == 0 else 1, c_in * t, rng))
            c_in = c_out
    last = make_divisible(1280 * max(1.0, width_mult))
    layers += _conv_bn(plan, c_in, last, 1, 1, _relu6, rng)
    return nn.Sequential(*layers, *_head(last, num_outputs, dropout, rng))


# --------------------------------------------------------------------------- MobileNetV3-Small


def squeeze_excite(channels: int, squeeze: int, rng, act=nn.ReLU, gate=nn.Hardsigmoid) -> Block:
    """Squeeze-and-excitation (Hu et al., 2018): x * gate(conv1x1(act(conv1x1(gap(x))))), the
    (N, C, 1, 1) weights broadcast over the map."""
    return Block([[], [nn.GlobalAvgPool2d(), nn.Conv2d(channels, squeeze, 1, rng=rng), act(),
                       nn.Conv2d(squeeze, channels, 1, rng=rng), gate()]], "mul")


@models.register_model("mobilenet_v3_small", input_rank=3)
def mobilenet_v3_small(input_shape, num_outputs, *, width_mult: float = 1.0, dropout=0.0,
                       rng=None, **_):
    """MobileNetV3-Small (Howard et al., 2019, "Searching for MobileNetV3", table 2): a 3x3/2
    conv stem with hard-swish, 11 bottlenecks (ReLU or hard-swish, squeeze-and-excitation with
    a hard-sigmoid gate and 1/4 of the expanded width), a 1x1 conv to 576, global average
    pool, a 1024-unit hard-swish layer, linear head. `width_mult` scales every width (the
    1024 too, as torchvision does). 2.54M parameters at 1.0 with 1000 classes."""
    def w(c):
        return _scaled(c, width_mult, "mobilenet_v3_small")

    plan = _Plan("mobilenet_v3_small", input_shape)
    eps = 1e-3
    c_in = w(16)
    layers = _conv_bn(plan, input_shape[0], c_in, 3, 2, nn.Hardswish, rng, eps=eps, stem=True)
    for k, exp, c, se, hs, s in [(3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2),
                                 (3, 88, 24, False, False, 1), (5, 96, 40, True, True, 2),
                                 (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
                                 (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1),
                                 (5, 288, 96, True, True, 2), (5, 576, 96, True, True, 1),
                                 (5, 576, 96, True, True, 1)]:
        exp, c = w(exp), w(c)
        block_se = squeeze_excite(exp, make_divisible(exp // 4), rng) if se else None
        layers.append(inverted_residual(plan, c_in, c, s, exp, rng, kernel=k, eps=eps,
                                        act=nn.Hardswish if hs else nn.ReLU, se=block_se))
        c_in = c
    last = 6 * c_in
    layers += _conv_bn(plan, c_in, last, 1, 1, nn.Hardswish, rng, eps=eps)
    return nn.Sequential(*layers, *_head(last, num_outputs, dropout, rng, [w(1024)],
                                         nn.Hardswish))


# --------------------------------------------------------------------------- ShuffleNetV2


_SHUFFLE_WIDTHS = {0.5: [24, 48, 96, 192, 1024], 1.0: [24, 116, 232, 464, 1024],
                   1.5: [24, 176, 352, 704, 1024], 2.0: [24, 244, 488, 976, 2048]}


def shuffle_unit(plan: _Plan, c_in: int, c_out: int, stride: int, rng) -> nn.Sequential:
    """ShuffleNetV2's unit (Ma et al., 2018, fig. 3 c/d), then a channel shuffle of 2 groups.
    Basic (c_in == c_out, stride 1): split the channels in halves, the second through 1x1 -
    dw3x3 - 1x1, concatenated with the first. Downsampling (or widening): both branches see
    all channels, dw3x3/s - 1x1 and 1x1 - dw3x3/s - 1x1, each giving c_out / 2."""
    half = c_out // 2
    if stride == 1 and c_in == c_out:
        right = [nn.Slice(1, half, c_in)] + _conv_bn(plan, half, half, 1, 1, nn.ReLU, rng) \
            + _conv_bn(plan, half, half, 3, 1, None, rng, groups=half) \
            + _conv_bn(plan, half, half, 1, 1, nn.ReLU, rng)
        block = Block([[nn.Slice(1, 0, half)], right], "concat")
    else:
        s = plan.stride(stride)
        start = plan.hw
        left = _conv_bn(plan, c_in, c_in, 3, s, None, rng, groups=c_in) \
            + _conv_bn(plan, c_in, half, 1, 1, nn.ReLU, rng)
        plan.hw = start
        right = _conv_bn(plan, c_in, half, 1, 1, nn.ReLU, rng) \
            + _conv_bn(plan, half, half, 3, s, None, rng, groups=half) \
            + _conv_bn(plan, half, half, 1, 1, nn.ReLU, rng)
        block = Block([left, right], "concat")
    return nn.Sequential(block, nn.ChannelShuffle(2))


@models.register_model("shufflenet_v2", input_rank=3)
def shufflenet_v2(input_shape, num_outputs, *, width_mult: float = 1.0, dropout=0.0, rng=None,
                  **_):
    """ShuffleNetV2 (Ma et al., 2018, "ShuffleNet V2: Practical Guidelines for Efficient CNN
    Architecture Design", table 5): a 3x3/2 conv stem and a 3x3/2 max pool, three stages of
    4, 8, 4 units (channel split, concat, channel shuffle; the first unit of each stage
    downsamples), a 1x1 conv, global average pool, linear head. `width_mult` is the paper's
    0.5, 1.0, 1.5 or 2.0 (another value scales the three stages of 1.0, rounded to even).
    2.28M parameters at 1.0 with 1000 classes."""
    mult = _multiplier(width_mult, "width_mult", "shufflenet_v2")
    widths = _SHUFFLE_WIDTHS.get(mult) or [24, *(2 * max(1, round(c * mult / 2))
                                                for c in (116, 232, 464)), 1024]
    plan = _Plan("shufflenet_v2", input_shape)
    layers = _conv_bn(plan, input_shape[0], widths[0], 3, 2, nn.ReLU, rng, stem=True)
    if plan.stride(2, stem=True) == 2:
        plan.step(3, 2, 1)
        layers.append(nn.MaxPool2d(3, 2, 1))
    c_in = widths[0]
    for c, repeats in zip(widths[1:4], (4, 8, 4)):
        for i in range(repeats):
            layers.append(shuffle_unit(plan, c_in, c, 2 if i == 0 else 1, rng))
            c_in = c
    layers += _conv_bn(plan, c_in, widths[4], 1, 1, nn.ReLU, rng)
    return nn.Sequential(*layers, *_head(widths[4], num_outputs, dropout, rng))


# --------------------------------------------------------------------------- EfficientNet-B0


@models.register_model("efficientnet_b0", input_rank=3)
def efficientnet_b0(input_shape, num_outputs, *, width_mult: float = 1.0,
                    depth_mult: float = 1.0, dropout=0.0, rng=None, **_):
    """EfficientNet-B0 (Tan & Le, 2019, "EfficientNet: Rethinking Model Scaling for
    Convolutional Neural Networks", table 1): a 3x3/2 conv stem, 16 MBConv blocks (SiLU,
    squeeze-and-excitation at 1/4 of the block's input width with a sigmoid gate), a 1x1 conv
    to 1280, global average pool, linear head. `width_mult` and `depth_mult` are the compound
    scaling coefficients (B0: 1.0, 1.0). Stochastic depth (a training regulariser) is left
    out. 5.29M parameters with 1000 classes."""
    depth_mult = _multiplier(depth_mult, "depth_mult", "efficientnet_b0")

    def w(c):
        return _scaled(c, width_mult, "efficientnet_b0")

    plan = _Plan("efficientnet_b0", input_shape)
    c_in = w(32)
    layers = _conv_bn(plan, input_shape[0], c_in, 3, 2, nn.SiLU, rng, stem=True)
    for t, k, s, c, n in [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
                          (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]:
        c_out = w(c)
        for i in range(math.ceil(n * depth_mult)):
            exp = c_in * t
            se = squeeze_excite(exp, max(1, c_in // 4), rng, act=nn.SiLU, gate=nn.Sigmoid)
            layers.append(inverted_residual(plan, c_in, c_out, s if i == 0 else 1, exp, rng,
                                            kernel=k, act=nn.SiLU, se=se))
            c_in = c_out
    last = 4 * c_in
    layers += _conv_bn(plan, c_in, last, 1, 1, nn.SiLU, rng)
    return nn.Sequential(*layers, *_head(last, num_outputs, dropout, rng))
