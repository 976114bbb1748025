"""One job end to end: the runner (compose -> resolve -> build -> train -> finish -> record), its outcomes
(failed, oom, diverged, interrupted), signal handling, run loggers and `--plan`."""
