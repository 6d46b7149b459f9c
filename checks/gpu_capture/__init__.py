"""A real nsys capture of a VeRL-shaped step on a GPU, checked against the GPU's own clocks.

A driver process marks ``step > gen, reward, old_log_prob, ref, adv, update_actor,
update_weights`` with ``nvtx_phases`` and launches no GPU work; a rollout process decodes with
``torch.cuda.CUDAGraph`` replays and a trainer process runs forward/backward/AdamW, both on
device 0 (their ``weight_sync`` overlaps), each under its own ``nsys profile``; the driver runs
the NVML sampler and reads the GPU's energy counter at phase ends; the workers time each
command's GPU work with CUDA events. Captured twice (``--cuda-graph-trace=graph`` and
``=node``).

Two steps, so that a GPU machine without a report-writing nsys can be used
(``../shared/nsys/device-capture.md``): the **device step** (``--step device``: capture, pack
each mode as ``<mode>.tar.gz`` with ``capture.json``; standard library, torch and the capture
side only) and the **import step** (``--step import``, here: ``QdstrmImporter`` → ``.nsys-rep``
→ SQLite, analyzed with nvtx-phases, checked). Checks: the driver's phase set and nesting, both
worker processes present and inside the driver's phases, driver wall time vs the JSONL
recorder; on a GPU also kernels traced at all, one physical GPU (UUID) for both workers'
reports, each range's traced GPU span vs its CUDA events, graph time (graph capture) vs the
replays' kernel time (node capture), energy per driver phase vs the counter reads
(``checks.gpu_check``'s tolerance). Without CUDA (or ``--dry-run``) everything runs on the CPU
under this machine's nsys and the GPU-only checks say "not run: needs a GPU".

Modules: ``model`` (names, sizes, options), ``worker`` (rollout/trainer processes), ``driver``
(the marked step loop), ``device`` (the device step), ``importer`` (qdstrm → SQLite, samples →
Parquet), ``verify`` (checks any capture allows), ``gpu_checks`` (GPU-only checks),
``analysis_step`` (analysis and all checks), ``report``, ``runner`` (command line).
"""
