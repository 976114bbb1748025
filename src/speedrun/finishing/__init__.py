"""After training: evaluation (val_loss, val_bpb), quantization and compression into the artifact, the code it
counts, and score-first test-time training; finalize.py runs them in order."""
