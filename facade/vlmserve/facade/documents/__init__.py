"""PDF rendering off the facade's process: worker processes under memory and CPU limits."""
