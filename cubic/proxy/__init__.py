"""Proxy models: features of (workload, config) pairs and XGBoost models of throughput and
feasibility learned from measured trials, with their quality measured and their versions
stored. Nothing here runs or simulates a job: the models learn only from trials."""

from __future__ import annotations

from cubic.proxy.features import feature_names, featurize
from cubic.proxy.model import ProxyModel, select_objective
from cubic.proxy.quality import cross_validate, evaluate, newest_holdout
from cubic.proxy.training import Retrainer, fit_and_store, load_latest, training_set

__all__ = [
    "ProxyModel",
    "Retrainer",
    "cross_validate",
    "evaluate",
    "feature_names",
    "featurize",
    "fit_and_store",
    "load_latest",
    "newest_holdout",
    "select_objective",
    "training_set",
]
