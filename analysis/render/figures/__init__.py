"""Figures: each draws one chart and writes the data it draws beside it (NAME.csv)."""
