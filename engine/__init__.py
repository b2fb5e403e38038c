"""tunebench engine: everything that trains. Never imports textual or workbench."""
