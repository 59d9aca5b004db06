"""Gold: temporal joins and SQL pipelines over silver, each driving event emitted exactly once."""
