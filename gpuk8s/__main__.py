"""Allows `python -m gpuk8s`."""

from gpuk8s.cli import main

if __name__ == "__main__":
    main()
