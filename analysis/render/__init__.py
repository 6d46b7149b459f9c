"""Output: files written atomically, the terminal table, figures, and the HTML/Markdown report. Nothing here computes a metric."""
