"""How the same math is done fast: Triton tiles (tiles), CUDA graphs of the training step (graphs), the opt-in
step profile (profile), the shared compile cache (cache) and the tuned tables (tuned). The kernel config group
(speedrun.config.kernel) selects them; speedrun.plan.kernel resolves it against the device. Importing this package
does no work."""
