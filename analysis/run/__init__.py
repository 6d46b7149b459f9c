"""Stage 3, run: input discovery, per-file loading (serial, process pool, Ray), spilling, clock alignment, and the pipeline that chains the stages."""
