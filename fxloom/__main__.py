"""`python -m fxloom` runs the command-line interface (see fxloom.cli)."""

from fxloom.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
