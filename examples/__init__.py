"""Worked examples built from kernels.fuse regions."""
