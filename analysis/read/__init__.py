"""Stage 1, read: which columns of which export table (specs), the read-only Arrow reader (export), read-ahead (prefetch)."""
