"""Stage 4, attribute: phase map, NVTX hierarchy and steps, interval arithmetic, GPU operations onto ranges (projection and window), bucket by bucket."""
