"""The model: the built-in GPT of parameter-golf's baseline family, its shape, its optimizers, fp8 linears and the
attention backends (attention/, one module per backend, looked up by name)."""
