"""HTTP floor: the protocol, bodies, limits, errors, API keys, request ids and metrics;
nothing about Responses."""
