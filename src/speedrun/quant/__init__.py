"""Quantization and compression of the model into the artifact: round-to-nearest and GPTQ codes (quantize.py,
gptq.py), low-rank error correction (lqer.py), tensor classes (classes.py), the compressors (compression.py) and
the per-group container (pergroup.py), and the per-tensor report (report.py)."""
