"""Stage 6, energy: NVML power samples on the trace clock (samples) and energy per phase, per device and between phases (phases)."""
