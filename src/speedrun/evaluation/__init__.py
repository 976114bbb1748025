"""Scoring a model on the validation stream: val_loss and val_bpb over standard or sliding windows, the BPB sums
all-reduced over the ranks (evaluate.py). Training's periodic validation and the finish both use it."""
