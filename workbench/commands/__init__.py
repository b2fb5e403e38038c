"""Subcommands of `tunebench`, one module each, discovered by `workbench.cli`.

A module here defines `register(subparsers)` and sets `func=` on its parser(s); `func(args)` returns
the exit code. Import torch/textual/datasets inside functions, never at module top.
"""
