"""Score-first test-time training: per-document LoRA adapters trained on the validation stream as it is scored
(score_first.py runs a pass; settings.py, schedule.py, scorers.py, steps.py, adapt.py and result.py its parts;
lora.py the adapters), the documents' batches and dealing (documents.py), the unadapted base scores
(base_scores.py), phased global TTT (global_phases.py), the adapters' optimizer (optim.py) and the CUDA-graphed
steps (graphs.py)."""
