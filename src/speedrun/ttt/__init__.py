"""Score-first test-time training: per-document LoRA adapters trained on the validation stream as it is scored
(score_first.py, lora.py), the documents' batches and dealing (documents.py), the unadapted base scores
(base_scores.py), phased global TTT (global_phases.py), the adapters' optimizer (optim.py) and the CUDA-graphed
steps (graphs.py)."""
