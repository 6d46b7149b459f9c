"""Stage 5, aggregate: per-range sums → the phase table, kernel table and totals (phases); per-step spread over steps (steps)."""
