"""One run on several processes: the world (ranks, process groups, collectives), the guard that ends every rank
when one fails, and the launch of ranks from `python -m run dist.nproc=N`, torchrun or SLURM."""
