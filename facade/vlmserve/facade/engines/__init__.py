"""The models a facade serves: where their engines are (config) and how a request finds its pool."""
