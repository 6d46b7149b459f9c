"""RLVR workload views (compute only): response lengths and fits, stragglers, fidelity against VeRL's timers, run comparison."""
