"""The per-tensor report of an artifact (``artifact_tensors.json`` in the run dir): for every tensor its class, how
it was stored, its clip, what quantization cost it and the bytes it takes, so one sees where the bytes go.

Errors are of the dequantized weight Ŵ (the LQER correction included) against the float weight W:
``rel_error`` = ||W - Ŵ||_F / ||W||_F, and for a matrix with a GPTQ Hessian H also ``rel_error_hessian`` =
sqrt(tr(E H E^T) / tr(W H W^T)) with E = W - Ŵ, the relative error of the layer's output on the calibration
activations (what GPTQ minimises). ``rel_error_before_lqer`` is the first without the correction.

Bytes: ``stored_bytes`` is what a tensor's fields hold before compression; ``group`` the compressed stream its codes
went into (quant.compressor=pergroup: its group, e.g. ``q.mlp``; another compressor: ``all``, the one stream);
``est_bytes`` shares each group's compressed bytes out over the fields in it by their order-0 byte entropy (a
field of constant bytes gets next to nothing), an estimate whose sum is the blob less the pergroup header.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from speedrun.core.pergroup import group_of, tensor_class
from speedrun.core.quant import dequantize_entry

REPORT = "artifact_tensors.json"


def byte_entropy(t: torch.Tensor) -> float:
    """Order-0 entropy of a tensor's stored bytes, in bytes (entropy per byte x bytes / 8)."""
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    if data.size == 0:
        return 0.0
    p = np.bincount(data, minlength=256) / data.size
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum()) * data.size / 8


def _clip_summary(w: torch.Tensor, entry: dict[str, torch.Tensor], bits: int) -> dict[str, float]:
    """The clips the scales stand for (scale x qmax per row), against the row's absmax and standard deviation."""
    rows = w.reshape(entry["scale"].numel(), -1)
    clip = entry["scale"].float() * (2 ** (bits - 1) - 1)
    absmax = rows.abs().amax(dim=1).clamp_min(1e-12)
    out = {
        "clip_mean": float(clip.mean()),
        "clip_over_absmax_mean": float((clip / absmax).mean()),
        "clip_over_absmax_min": float((clip / absmax).min()),
        "clipped_fraction": float((rows.abs() > clip[:, None] * (1 + 1e-3)).float().mean()),
    }
    if rows.size(1) > 1:
        out["clip_over_std_mean"] = float((clip / rows.std(dim=1).clamp_min(1e-12)).mean())
    return {k: round(v, 6) for k, v in out.items()}


def default_rule(name: str, entry: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The rule of a tensor the int8 export packed (quantize_int6 records its own)."""
    if "q" in entry:
        return {"class": tensor_class(name), "method": "int8", "bits": 8, "clip": "quantile"}
    kind = next(iter(entry))
    return {"class": "float", "method": kind, "bits": entry[kind].element_size() * 8, "clip": None}


def rules_of(
    packed: dict[str, dict[str, torch.Tensor]], hessians: dict[str, torch.Tensor], q: Any
) -> dict[str, dict[str, Any]]:
    """The rule each tensor of quant=int6's packed state dict got, as speedrun.core.quant.quantize_int6 applies them
    (``q``: the quant settings): class, method (gptq, rtn, or how a float tensor is kept), bits, clip, and the AWQ
    and LQER fields where an entry has them. {} for quant=int8 (default_rule names its tensors)."""
    if q.name != "int6":
        return {}
    rules: dict[str, dict[str, Any]] = {}
    for name, entry in packed.items():
        cls = tensor_class(name)
        if "q" not in entry:
            kind = next(iter(entry))
            rules[name] = {"class": "float", "method": kind, "bits": entry[kind].element_size() * 8, "clip": None}
            continue
        if name not in hessians and q.gate_bits is not None and cls == "gate":
            rules[name] = {"class": "gate", "method": "rtn", "bits": q.gate_bits, "clip": "absmax"}
        else:
            gptq = name in hessians
            k = float(getattr(q.sigmas, "matrix" if cls == "gate" else cls))
            rules[name] = {
                "class": cls,
                "method": "gptq" if gptq else "rtn",
                "bits": q.bits if gptq and cls != "embed" else q.embed_bits,
                "clip": f"sigma {k:g}" if q.clip == "sigma" else "absmax_search",
            }
        if "awq_start" in entry:
            size = int(entry["awq_size"][0])
            rules[name]["awq"] = {"starts": entry["awq_start"].tolist(), "size": size, "bits": q.awq.bits}
        if "lqer_a" in entry:
            lqer = q.lqer
            rules[name]["lqer"] = {
                "rank": entry["lqer_a"].shape[0],
                "factor_bits": lqer.factor_bits,
                "group": lqer.asym_group,
            }
    return rules


def tensor_report(
    state: dict[str, torch.Tensor],
    packed: dict[str, dict[str, torch.Tensor]],
    rules: dict[str, dict[str, Any]],
    hessians: dict[str, torch.Tensor],
    group_bytes: dict[str, int],
    compressor: str,
) -> dict[str, Any]:
    """The report: {"tensors": [...], "classes": {...}, "groups": {...}} (module docstring)."""
    pergroup = compressor == "pergroup"
    rows: list[dict[str, Any]] = []
    fields: list[tuple[int, str, float]] = []  # (row index, group, order-0 entropy in bytes)
    for name, entry in packed.items():
        rule = rules.get(name) or default_rule(name, entry)
        w = state[name].detach().float().cpu()
        w_hat = dequantize_entry(entry)
        norm = float(w.norm()) or 1.0
        row: dict[str, Any] = {
            "name": name,
            **{k: rule.get(k) for k in ("class", "method", "bits", "clip")},
            "shape": list(w.shape),
            "params": w.numel(),
            "stored_bytes": sum(t.numel() * t.element_size() for t in entry.values()),
            "rel_error": round(float((w - w_hat).norm()) / norm, 6),
        }
        if "q" in entry:
            row["clip_summary"] = _clip_summary(w, entry, int(rule.get("bits") or 8))
        H = hessians.get(name)
        if H is not None and w.ndim == 2 and H.shape == (w.size(1), w.size(1)):
            H64 = H.detach().double().cpu()
            e = (w - w_hat).double()
            denom = float(((w.double() @ H64) * w.double()).sum())
            row["rel_error_hessian"] = (
                round(math.sqrt(max(float(((e @ H64) * e).sum()), 0.0) / denom), 6) if denom > 0 else None
            )
        if "lqer_a" in entry:
            plain = {k: v for k, v in entry.items() if not k.startswith("lqer")}
            row["lqer"] = rule.get("lqer")
            row["rel_error_before_lqer"] = round(float((w - dequantize_entry(plain)).norm()) / norm, 6)
        for field, t in entry.items():
            fields.append((len(rows), group_of(name, field, t) if pergroup else "all", byte_entropy(t)))
        rows.append(row)
    weight: dict[str, float] = {}
    for _, group, h in fields:
        weight[group] = weight.get(group, 0.0) + h
    est = [0.0] * len(rows)
    for i, group, h in fields:
        if weight[group] > 0:
            est[i] += group_bytes.get(group, 0) * h / weight[group]
    groups_of: dict[int, set[str]] = {}
    for i, group, _ in fields:
        groups_of.setdefault(i, set()).add(group)
    classes: dict[str, dict[str, Any]] = {}
    for i, (row, b) in enumerate(zip(rows, est)):
        row["group"] = sorted(groups_of.get(i, ())) if pergroup else "all"
        row["est_bytes"] = round(b)
        c = classes.setdefault(row["class"], {"tensors": 0, "params": 0, "stored_bytes": 0, "est_bytes": 0})
        c["tensors"] += 1
        c["params"] += row["params"]
        c["stored_bytes"] += row["stored_bytes"]
        c["est_bytes"] += round(b)
    return {"tensors": rows, "classes": classes, "groups": group_bytes}
