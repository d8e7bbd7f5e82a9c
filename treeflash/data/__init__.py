"""Shared data above the engine: prompt sets (bench, training and evaluation all draw on them)."""
