"""The train_drafter job's room: artifacts -> training rows (data.py), the Ray Train + DeepSpeed loop (loop.py)."""
