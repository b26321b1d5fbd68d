"""A Qwen3-style decode layer built only from kernels.fuse regions (see README.md here)."""
