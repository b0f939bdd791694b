"""The precompute job's room: its two Ray Data stages (stages.py)."""
