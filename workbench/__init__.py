"""tunebench workbench: the Textual app, the launcher and the CLI."""
