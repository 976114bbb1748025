"""What the tests share, written once: the CLI runs (cli), the fake devices of the resolver (devices), the two-rank
harness (ranks), the tiny models and their data (tiny) and the browser check of the report's page (browser).

Imported as ``support.<module>``: tests/ is on sys.path through tests/conftest.py (pytest's rootdir-based import
puts a conftest's folder there)."""
