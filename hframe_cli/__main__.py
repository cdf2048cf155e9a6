"""``python -m hframe_cli`` runs the ``hframe`` command."""

from .cli.entry import run

run()
