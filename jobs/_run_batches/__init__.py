"""The run_batches job's room: the leased queue of batch requests (batch_queue.py)."""
