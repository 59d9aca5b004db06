"""Importers: other tools' pipeline configs as Riverhouse specs (`riverhouse import ...`)."""
