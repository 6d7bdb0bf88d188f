"""Datasets and batching for the trainer: `load_dataset(SRC)` and `Loader`."""

from pocket.train.data.loader import Loader
from pocket.train.data.sources import DataError, Dataset, Split, load_dataset

__all__ = ["DataError", "Dataset", "Loader", "Split", "load_dataset"]
