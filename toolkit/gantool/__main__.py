"""``python -m gantool`` (and ``torchrun -m gantool train ...``)."""

from gantool.cli import main

if __name__ == "__main__":
    main()
