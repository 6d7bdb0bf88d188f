"""The edge zoo at test sizes, shared by the zoo tests (train, e2e export, the engine's arena)."""

from __future__ import annotations

from pocket.train import nn

# name -> small [model] options for the tests (each builds in milliseconds).
SMALL = {
    "resnet18": {"channels": [8, 8, 16, 16]},
    "squeezenet": {"width_mult": 0.125},
    "mobilenet_v2": {"width_mult": 0.25},
    "mobilenet_v3_small": {"width_mult": 0.25},
    "shufflenet_v2": {"width_mult": 0.25},
    "efficientnet_b0": {"width_mult": 0.25, "depth_mult": 0.34},
}


def randomize_bn(model, rng) -> None:
    """BatchNorm statistics and affines as after training, so that folding them is exercised."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean[...] = rng.normal(0, 0.2, c)
            m.running_var[...] = rng.uniform(0.5, 1.5, c)
            m.weight.data[...] = rng.uniform(0.5, 1.5, c)
            m.bias.data[...] = rng.normal(0, 0.2, c)
