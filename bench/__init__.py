"""Benchmarks (``make bench``): whole-process timings, ratios against a baseline in the same run."""
