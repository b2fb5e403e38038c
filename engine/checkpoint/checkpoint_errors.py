"""The one error type of checkpoint loading/saving: a ConfigError, so the CLI prints one line, exit 2."""

from engine.config import ConfigError


class CheckpointError(ConfigError):
    """A checkpoint folder or file the user must fix: names the file (and key), says what to do."""
