"""The API routes, one module per route group: each reads a request and answers it; none is
a library for another."""
