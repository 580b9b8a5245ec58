"""Benchmarks of question-broker against the raw Redis floor and arq (``python -m benchmarks``)."""
