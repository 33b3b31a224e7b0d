"""Model checkpoints a run uses: resolving a spec's or a golden's model with every file's
sha256 enforced (``resolve.py``), the generated tiny Llama, the embedded default
(``tiny.py``), and the numerics battery's generated families (``families.py``)."""
