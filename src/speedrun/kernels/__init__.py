"""How the same math is done fast: Triton tiles (tiles), CUDA graphs of the training step (graphs), the opt-in
step profile (profile), the shared compile cache (cache) and the tuned tables (tuned). The kernel config group
(speedrun.config.kernel) selects them; speedrun.plan.kernel_choice resolves it against the device. Importing this package
does no work."""

GRAPH_EAGER_CALLS = 2
"""Micro-batches run eagerly at a new shape before its CUDA graph is captured (speedrun.core.compile): the
compiled code and its autotuning must have run before capture. The resolver (speedrun.plan.kernel_choice) sizes the
warm-up from it."""
