"""The reference workload: a seeded e-commerce customer-service request generator with
verifiable answers in three difficulty classes, its committed splits and its scorer.

Pure Python (no torch), so the router and benchmarks can use it.
"""

from services.workload.generator import (
    CLASSES,
    STORE,
    RequestClass,
    WorkloadItem,
    class_counts,
    drill_stream,
    generate,
    normalise_mix,
    stream,
)
from services.workload.scoring import final_answer, score
from services.workload.splits import (
    SPLIT_NAMES,
    SPLITS,
    TRAFFIC_MIX,
    TRAIN_MIX,
    build_splits,
    held_out_prompts,
    load_split,
    write_splits,
)

__all__ = [
    "CLASSES",
    "SPLITS",
    "SPLIT_NAMES",
    "STORE",
    "TRAFFIC_MIX",
    "TRAIN_MIX",
    "RequestClass",
    "WorkloadItem",
    "build_splits",
    "class_counts",
    "drill_stream",
    "final_answer",
    "generate",
    "held_out_prompts",
    "load_split",
    "normalise_mix",
    "score",
    "stream",
    "write_splits",
]
