"""The headless demo (``make course HEADLESS=1``): the course's pipeline on the seeds' block, in a terminal."""
from __future__ import annotations

import sys


def main() -> int:
    import torch

    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, cuda={torch.cuda.is_available()}")
    print("The course notebooks are in notebooks/; run `make course` to open them in JupyterLab.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
