"""Benchmarks: how fast each strategy finds good configurations, measured on the simulator."""

from __future__ import annotations
