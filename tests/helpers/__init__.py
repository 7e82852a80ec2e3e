"""Code the tests share that is not a fixture: tiny_run (a tiny training run, importable and as
a subprocess script)."""
