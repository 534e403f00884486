"""Code the engine, the facade and the client library all use: image checks, loopback hosts.

It lives in the base install (`clients/`), which both the engine and the facade depend on.
"""
