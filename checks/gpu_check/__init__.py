"""A prepared GPU check: does the project's power and energy accounting hold on a real GPU.

Runs a small torch workload marked with the project's NVTX helpers (steps of ``idle``, ``gen``
and ``update_actor`` phases of clearly different power), with the JSONL range recorder on and the
project's NVML sampler beside it. The workload process itself also reads the GPU's total-energy
counter (``nvmlDeviceGetTotalEnergyConsumption``) synchronously, right after
``torch.cuda.synchronize()``, at the start and the end of every phase: an independent reference.
Then, with the project's analysis functions (``analysis.energy.samples``), it checks

(a) the pipeline's per-phase energy (energy counter from the sampler's samples, interpolated at
    the window's ends: the ``nvml-counter`` path) against the workload's own counter reads, per
    phase (tolerance set by the counter's update period) and over the whole run (1%); that both
    counter paths agree on the boundary times (sampler clock vs workload clock); and, as
    information, how far integrating the sampled ``power_w`` is from the counter per phase (NVML's
    power reading is a ~1 s average on recent GPUs), with a 5% gate over the whole run only;
(b) the power ordering update_actor > gen > idle;
(c) that phase boundaries line up with the counter-derived power edges (clock alignment), within
    1.5 (median) and 2.5 (each) counter update periods; the sampled-power edge lag as information;
(d) that the sampler measured the GPU torch ran on;
(e) the sampling interval achieved (and how often the counter and power readings change).

Writes ``gpu_check.json`` (with the workload's counter reads), ``gpu_check.md``, ``ranges.jsonl``
and ``power.parquet`` to ``--out``; exits 0 when every gated check passes, 1 otherwise.

``--dry`` (automatic without CUDA or NVML): the same workload on CPU with tiny sizes; checks the
JSONL ranges and, on constructed power samples and counter reads with known energy, the analysis
code path.

``--reanalyze``: no run; the files a GPU run left in ``--out`` analyzed again (after a fix, or
with other tolerances), on any machine. A run captured before the workload read the counter
itself reports those gates as "not recorded in this run" (SKIP), not as failures.

Run: ``python -m checks.gpu_check --out out/gpu_check [--steps 3] [--phase-s 3.0] [--dry]``.

Modules, by job: ``cli`` (options, dry or GPU mode), ``model`` (constants, ``Config``, the report's
rows), ``stubs`` and ``project`` (stand-ins for missing packages; the project's functions, imported
in that one place), ``environment`` (NVML probes, versions), ``workload`` (the marked torch phases
and the hooks where the counter is read), ``timeline`` (ranges, clocks, samples), ``energy``
(pipeline and integrated energy per phase), ``reads`` (the workload's counter reads as reference),
``edges`` (power edges vs boundaries), ``gates`` (the checks and their tolerances), ``analyze``
(one run's analysis), ``synthetic`` (the dry run's constructed samples), ``report`` (JSON,
Markdown, tables), ``runner`` (capture, dry run, re-analysis, exit code). ``checks/README.md``: the
H200 results.
"""
