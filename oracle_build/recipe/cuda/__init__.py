"""The CUDA device's own part of the recipe: its toolkit (a lock's wheels or the host's,
named by its tools' sha256), oracle-build's nvcc launcher (standard library only, run by
ccache as nvcc), and `cuda-kernels` (real vLLM CUDA units compiled here without a GPU).
Generic recipe code reaches it only where the target's device says it builds with a
toolkit (devices: ``BUILD_TOOLKIT``)."""
