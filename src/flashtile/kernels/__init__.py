"""Triton kernels (forward, backward) and their launchers; imported only when first used."""
