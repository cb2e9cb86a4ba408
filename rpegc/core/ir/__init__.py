"""The plain-data IR: the program G° and its plan, the executable graph, expressions, located errors, model
presets, device coordinates, and the declaration of options."""
