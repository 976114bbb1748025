"""Benchmarks anyone can re-run: each measured claim is a check, declared once as data (speedrun/bench/checks/),
run on one machine in one process (``python -m speedrun.bench NAME``) and recorded as a result file under
benchmarks/results/, from which docs/benchmarks.md is generated (``python -m speedrun.bench --render``).

spec.py says what a check is; steps.py what it runs, readiness.py whether this machine can, runner.py runs it
(execute.py starts the processes); metrics.py and parsers.py read what its arms measured; render.py
writes the page. Nothing here is imported by a training run.
"""
