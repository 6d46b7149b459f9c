"""The report (HTML, Markdown) and the other text outputs: comparison, what-if, VeRL logs."""
