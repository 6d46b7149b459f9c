"""A real VeRL 0.9.1 GRPO run on a CPU-only machine, traced with nsys: ``make profile-verl``.

``cpu_platform`` registers a VeRL platform named ``cpu`` (loaded through
``VERL_USE_EXTERNAL_MODULES``); ``build_assets`` writes the tiny random Qwen2 model, its
byte-level BPE tokenizer and the parquet prompts; ``run`` launches VeRL under nsys and analyzes
the trace against VeRL's own timers.
"""
