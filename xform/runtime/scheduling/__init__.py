"""Scheduling: how lines become batches (batching.py: examples or tokens, read-ahead windows) and
in-flight batching of requests into one running batch (scheduler.py)."""
