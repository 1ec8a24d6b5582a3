"""What generated code calls at run time: kernel launchers and CUDA graph runners (no codegen here)."""
