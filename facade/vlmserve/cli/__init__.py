"""`vlmserve`: the one command (serve, engine, facade, models, doctor, service); see main.py."""
