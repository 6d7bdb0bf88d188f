"""pocket: train a real network on a small card or a CPU, ship it int8 to a small device."""

__version__ = "0.1.0"
