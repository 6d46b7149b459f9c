"""Stage 2, normalize: raw export rows → tidy NVTX ranges and GPU operations (events), operation classes, physical devices, launch linking."""
