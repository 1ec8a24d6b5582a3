"""What generated code calls at run time: kernel launchers and CUDA-graph trees (no codegen here)."""
