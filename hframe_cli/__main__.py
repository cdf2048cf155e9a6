"""``python -m hframe_cli`` runs the ``hframe`` command."""

from .entry import run

run()
