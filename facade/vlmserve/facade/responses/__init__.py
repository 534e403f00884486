"""A response from body to final write: preparation, the running generation, its events,
background runs, item references, the model catalog."""
