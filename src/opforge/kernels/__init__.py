"""Triton kernels, one module per family. No front-end imports these directly."""
