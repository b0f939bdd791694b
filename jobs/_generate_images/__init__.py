"""The generate_images job's room: its actor (worker.py) and its report (report.py)."""
