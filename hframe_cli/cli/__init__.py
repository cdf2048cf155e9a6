"""The hframe command: typer options, one core call, rendering. Nothing else imports it."""
