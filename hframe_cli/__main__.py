"""``python -m hframe_cli`` runs the ``hframe`` command."""

from .cli import run

run()
