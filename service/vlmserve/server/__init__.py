"""Code the engine and the facade share and the client library never uses: settings, logs, the
launcher's lifeline, secrets and loopback hosts.

It lives in `service/`, outside the client's source root (`clients/`), so the client library
cannot import it (`tests/client/test_client_install.py`).
"""
