"""State: settings, Delta table layout and creation, and resetting what a pipeline has written."""
