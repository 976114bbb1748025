"""precision=fp8: the block linears multiply in fp8 through torch._scaled_mm with tensorwise scales.

Forward: activations and weights in e4m3 (more mantissa). Backward: the incoming gradient in e5m2 (more range),
multiplied against the saved e4m3 operands. Each tensor gets one scale, amax -> the format's largest finite
value, computed on the fly (no delayed-scaling history to get wrong). Master weights stay fp32 and the optimizer
never sees fp8. Only while the module is in training mode: eval runs the ordinary bf16 matmul, so val_bpb is
measured on the same weights without fp8 rounding.

_scaled_mm wants its first operand row-major and its second column-major, with dimensions divisible by 16;
``convert_linears`` only converts layers whose shapes allow it.
"""

from __future__ import annotations

import torch
import torch.nn as nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _to_fp8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x -> (fp8 tensor, inverse scale) with x ~= fp8 * inverse scale."""
    amax = x.detach().abs().amax().float().clamp_min(1e-12)
    scale = torch.finfo(dtype).max / amax
    return (x.float() * scale).to(dtype), scale.reciprocal()


def _col_major(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


class _FP8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        x8, x_inv = _to_fp8(x, E4M3)
        w8, w_inv = _to_fp8(weight, E4M3)
        ctx.save_for_backward(x8, x_inv, w8, w_inv)
        ctx.out_dtype, ctx.x_dtype, ctx.w_dtype = out_dtype, x.dtype, weight.dtype
        # (N, in) @ (in, out): weight (out, in) row-major transposed is column-major, as _scaled_mm wants.
        return torch._scaled_mm(x8, w8.t(), scale_a=x_inv, scale_b=w_inv, out_dtype=out_dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x8, x_inv, w8, w_inv = ctx.saved_tensors
        g8, g_inv = _to_fp8(grad, E5M2)
        # grad_x = grad (N, out) @ weight (out, in)
        grad_x = torch._scaled_mm(g8, _col_major(w8), scale_a=g_inv, scale_b=w_inv, out_dtype=ctx.out_dtype)
        # grad_w = grad^T (out, N) @ x (N, in)
        grad_w = torch._scaled_mm(
            g8.t().contiguous(), _col_major(x8), scale_a=g_inv, scale_b=x_inv, out_dtype=torch.float32
        )
        return grad_x.to(ctx.x_dtype), grad_w.to(ctx.w_dtype), None


class FP8Linear(nn.Linear):
    """nn.Linear (no bias) whose training-mode matmuls run in fp8; same parameters, same state_dict keys."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        out_dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        if out_dtype == torch.float32:
            out_dtype = torch.bfloat16  # _scaled_mm outputs a 16-bit or fp32 type; keep the cheap one
        lead = x.shape[:-1]
        with torch.autocast(x.device.type, enabled=False):
            y = _FP8Matmul.apply(x.reshape(-1, x.shape[-1]), self.weight, out_dtype)
        return y.view(*lead, self.out_features)


TARGET_MODULES = {
    "mlp_down": ("mlp.proj",),
    "mlp": ("mlp.fc", "mlp.proj"),
    "attn_proj": ("attn.proj",),
    "attn_qkv": ("attn.c_q", "attn.c_k", "attn.c_v"),
}
"""kernel.fp8 targets -> the block-relative module names they convert ("all": every block linear)."""


def target_filter(targets: tuple[str, ...] | list[str] = ("all",)):
    """A predicate on a module's qualified name (relative to the blocks, e.g. "3.mlp.proj") for the targets."""
    if "all" in targets:
        return lambda name: True
    suffixes = tuple(s for t in targets for s in TARGET_MODULES[t])
    return lambda name: name.split(".", 1)[-1] in suffixes


def convert_linears(module: nn.Module, targets: tuple[str, ...] | list[str] = ("all",), _prefix: str = "") -> int:
    """Swap every bias-free nn.Linear whose dims are multiples of 16 and whose name matches ``targets`` (kernel.fp8:
    mlp_down, mlp, attn_proj, attn_qkv, all; names relative to ``module``, e.g. "0.mlp.proj" in model.blocks) for
    an FP8Linear sharing its weight. Returns how many were converted."""
    wanted = target_filter(targets)
    converted = 0
    for name, child in module.named_children():
        qualified = f"{_prefix}{name}"
        if (
            type(child) is nn.Linear
            and child.bias is None
            and child.in_features % 16 == 0
            and child.out_features % 16 == 0
        ):
            if wanted(qualified):
                fp8 = FP8Linear(child.in_features, child.out_features, bias=False, device="meta")
                fp8.weight = child.weight
                setattr(module, name, fp8)
                converted += 1
        else:
            converted += convert_linears(child, targets, f"{qualified}.")
    return converted


def convert_torchao(module: nn.Module, targets: tuple[str, ...] | list[str] = ("all",)) -> int:
    """kernel.fp8_impl=torchao: torchao.float8's tensorwise training recipe on the same targets (its own
    Float8Linear; state_dict keys unchanged). Returns how many linears it converted."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    wanted = target_filter(targets)
    picked: list[str] = []

    def keep(mod: nn.Module, fqn: str) -> bool:
        ok = isinstance(mod, nn.Linear) and mod.in_features % 16 == 0 and mod.out_features % 16 == 0 and wanted(fqn)
        if ok:
            picked.append(fqn)
        return ok

    convert_to_float8_training(module, config=Float8LinearConfig.from_recipe_name("tensorwise"), module_filter_fn=keep)
    return len(picked)


__all__ = ["FP8Linear", "convert_linears", "convert_torchao", "target_filter", "TARGET_MODULES"]
