"""The complexity predictor the router runs per request: hashed word n-grams and shape features
into a softmax over the cheapest tier that answers correctly, read as a score in [0, 1].

Inference is numpy only (well under a millisecond); the weights are trained offline by
`services/routing/predictor_training.py` and committed as an .npz artifact. Knows nothing of
gRPC or models.
"""

from __future__ import annotations

import itertools
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.common.tiers import TIER_NAMES

DIMENSIONS = 4096
LEVELS = np.array([0.0, 0.5, 1.0])  # small, medium, large: the score is the expected level
CLASSES = TIER_NAMES  # the classes, cheapest first: the tier names
DEFAULT_ARTIFACT = Path(__file__).with_name("complexity_model.npz")
_TOKEN = re.compile(r"[a-z]+|\d+|[^\sa-z\d]")


def grams(text: str) -> list[str]:
    """What the predictor sees of a text: word 1-grams ("w:six"), 2-grams ("b:six white") and
    shape counts (numbers "n:", length in eighths of tokens "l:", commas "c:", "and"s "a:")."""
    tokens = _TOKEN.findall(text.lower())
    found = [f"w:{t}" for t in tokens]
    found += [f"b:{a} {b}" for a, b in itertools.pairwise(tokens)]
    numbers = sum(t.isdigit() for t in tokens)
    found += [f"n:{min(numbers, 8)}", f"l:{min(len(tokens) // 8, 10)}"]
    found += [f"c:{min(text.count(','), 6)}", f"a:{min(tokens.count('and'), 4)}"]
    return found


def gram_index(gram: str) -> int:
    """The hashed feature a gram falls in (several grams may share one)."""
    return zlib.crc32(gram.encode()) % DIMENSIONS


def features(text: str) -> dict[int, float]:
    """Hashed, L2-normalised sparse features: word 1- and 2-grams plus shape counts."""
    vector: dict[int, float] = {}
    for gram in grams(text):
        index = gram_index(gram)
        vector[index] = vector.get(index, 0.0) + 1.0
    norm = float(np.sqrt(sum(v * v for v in vector.values()))) or 1.0
    return {k: v / norm for k, v in vector.items()}


@dataclass(frozen=True)
class ComplexityModel:
    """Softmax weights (classes x DIMENSIONS) and biases, plus tuned thresholds."""

    weights: np.ndarray  # (3, D)
    bias: np.ndarray  # (3,)
    small_below: float = 0.3  # thresholds a cost_target policy uses (tuned on dev)
    medium_below: float = 0.7

    def probabilities(self, text: str) -> np.ndarray:
        """P(cheapest correct tier = small, medium, large) for one request text. (3,)"""
        sparse = features(text)
        index = np.fromiter(sparse.keys(), dtype=np.int64, count=len(sparse))
        values = np.fromiter(sparse.values(), dtype=np.float64, count=len(sparse))
        logits = self.weights[:, index] @ values + self.bias  # (3,)
        logits = logits - logits.max()
        exp = np.exp(logits)
        probs: np.ndarray = exp / exp.sum()
        return probs

    def score(self, text: str) -> float:
        """Predicted complexity in [0, 1]: the expected level of the cheapest correct tier."""
        return float(self.probabilities(text) @ LEVELS)

    def save(self, path: Path) -> None:
        np.savez_compressed(
            path,
            weights=self.weights.astype(np.float32),
            bias=self.bias.astype(np.float32),
            thresholds=np.array([self.small_below, self.medium_below], dtype=np.float64),
        )

    @staticmethod
    def load(path: Path = DEFAULT_ARTIFACT) -> ComplexityModel:
        with np.load(path) as data:
            thresholds = data["thresholds"]
            return ComplexityModel(
                weights=data["weights"].astype(np.float64),
                bias=data["bias"].astype(np.float64),
                small_below=float(thresholds[0]),
                medium_below=float(thresholds[1]),
            )
