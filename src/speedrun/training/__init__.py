"""Building what a Plan describes and training it: the loop, budgets, dense metrics, periodic work (validation,
checkpoints), resume and preemption, batch-size search, peak memory and MFU."""
