"""Shared bits of the inferwatch stack: the CLI and local process supervision."""

__version__ = "0.1.0"
