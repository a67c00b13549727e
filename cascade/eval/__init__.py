"""Evaluation: the measured numbers (intervals, pass@k) and the eval of one domain."""
