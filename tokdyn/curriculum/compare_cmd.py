"""``tokdyn compare`` registered as a stage command (the glue lives in :mod:`tokdyn.curriculum.cli`)."""

from .cli import add_compare_arguments as add_cli_arguments
from .cli import run_compare as run_cli

__all__ = ["add_cli_arguments", "run_cli"]
