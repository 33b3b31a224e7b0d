"""One module per command: capture, verify, analyze (margin, determinism), compare, explain."""
