"""`python -m perfrun` is the `perfrun` command."""

from perfrun.cli import console_main

console_main()
