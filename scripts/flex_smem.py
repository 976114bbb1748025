"""Evidence that the T4 flex tiles fit: shared memory of Triton kernels compiled for sm75 (a T4), read from
Triton's own compiler (CompiledKernel.metadata.shared), next to speedrun.kernels.tiles' estimate.

    python scripts/flex_smem.py --mimic     # any machine with triton (no GPU needed): kernels with flex's
                                            # structure (q/k/v/do tiles, the same dots and transposes)
    python scripts/flex_smem.py --flex      # a CUDA machine: flex's own generated kernels, compiled on this GPU
                                            # with the T4 tiles, then recompiled for sm75 and measured

Triton compiles for a target without that GPU: triton.compile(src, target=GPUTarget("cuda", 75, 32)) produces the
sm75 binary and its metadata (no driver needed). A T4 lets one program use 64 KB (Triton opts in above 48 KB).
Prints one table; exits 1 if a chosen tiling exceeds 64 KB on sm75.
"""

from __future__ import annotations

import argparse
import gc
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "src"))  # runs from a checkout

from speedrun.kernels.tiles import bwd_smem_bytes, choose_tiles, fwd_smem_bytes, rounded_head_dim  # noqa: E402

T4 = 64 * 1024
HEAD_DIMS = (64, 80, 96, 128)


def mimic_rows() -> list[list]:
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def fwd(Q, K, V, Out, stride, T, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n, offs_d = tl.arange(0, BLOCK_N), tl.arange(0, D)
        q = tl.load(Q + offs_m[:, None] * stride + offs_d[None, :])
        acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        for start in range(0, T, BLOCK_N):
            k = tl.load(K + (start + offs_n)[:, None] * stride + offs_d[None, :])
            v = tl.load(V + (start + offs_n)[:, None] * stride + offs_d[None, :])
            s = tl.dot(q, tl.trans(k))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
            m_i = m_new
        tl.store(Out + offs_m[:, None] * stride + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))

    @triton.jit
    def bwd(
        Q,
        K,
        V,
        DO,
        DQ,
        DK,
        DV,
        LSE,
        DELTA,
        stride,
        T,
        NUM_DQ,
        BLOCK_M1: tl.constexpr,
        BLOCK_N1: tl.constexpr,
        BLOCK_M2: tl.constexpr,
        BLOCK_N2: tl.constexpr,
        D: tl.constexpr,
    ):
        pid = tl.program_id(0)
        offs_d = tl.arange(0, D)
        if pid < NUM_DQ:  # dQ: q, do resident; k, v streamed (flex's bwd_dq_inner)
            offs_m2 = pid * BLOCK_M2 + tl.arange(0, BLOCK_M2)
            q = tl.load(Q + offs_m2[:, None] * stride + offs_d[None, :])
            do = tl.load(DO + offs_m2[:, None] * stride + offs_d[None, :])
            lse, di = tl.load(LSE + offs_m2), tl.load(DELTA + offs_m2)
            dq = tl.zeros([BLOCK_M2, D], dtype=tl.float32)
            for start in range(0, T, BLOCK_N2):
                offs_n2 = start + tl.arange(0, BLOCK_N2)
                kT = tl.load(K + offs_n2[None, :] * stride + offs_d[:, None])
                p = tl.math.exp2(tl.dot(q, kT) - lse[:, None])
                vT = tl.load(V + offs_n2[None, :] * stride + offs_d[:, None])
                ds = (p * (tl.dot(do, vT) - di[:, None])).to(tl.float16)
                dq += tl.dot(ds, tl.trans(kT))
            tl.store(DQ + offs_m2[:, None] * stride + offs_d[None, :], dq.to(tl.float16))
        else:  # dK/dV: k, v resident; q, do streamed (flex's bwd_dkdv_inner)
            offs_n1 = (pid - NUM_DQ) * BLOCK_N1 + tl.arange(0, BLOCK_N1)
            k = tl.load(K + offs_n1[:, None] * stride + offs_d[None, :])
            v = tl.load(V + offs_n1[:, None] * stride + offs_d[None, :])
            dk = tl.zeros([BLOCK_N1, D], dtype=tl.float32)
            dv = tl.zeros([BLOCK_N1, D], dtype=tl.float32)
            for start in range(0, T, BLOCK_M1):
                offs_m1 = start + tl.arange(0, BLOCK_M1)
                qT = tl.load(Q + offs_m1[None, :] * stride + offs_d[:, None])
                pT = tl.math.exp2(tl.dot(k, qT) - tl.load(LSE + offs_m1)[None, :])
                do = tl.load(DO + offs_m1[:, None] * stride + offs_d[None, :])
                dv += tl.dot(pT.to(tl.float16), do)
                dsT = (pT * (tl.dot(v, tl.trans(do)) - tl.load(DELTA + offs_m1)[None, :])).to(tl.float16)
                dk += tl.dot(dsT, tl.trans(qT))
            tl.store(DK + offs_n1[:, None] * stride + offs_d[None, :], dk.to(tl.float16))
            tl.store(DV + offs_n1[:, None] * stride + offs_d[None, :], dv.to(tl.float16))

    def shared(fn, sig, consts) -> int:
        src = ASTSource(fn, sig, constexprs=consts)
        return triton.compile(
            src, target=GPUTarget("cuda", 75, 32), options={"num_warps": 4, "num_stages": 1}
        ).metadata.shared

    fsig = {
        "Q": "*fp16",
        "K": "*fp16",
        "V": "*fp16",
        "Out": "*fp16",
        "stride": "i32",
        "T": "i32",
        "BLOCK_M": "constexpr",
        "BLOCK_N": "constexpr",
        "D": "constexpr",
    }
    bsig = {
        **dict.fromkeys("Q K V DO DQ DK DV".split(), "*fp16"),
        "LSE": "*fp32",
        "DELTA": "*fp32",
        "stride": "i32",
        "T": "i32",
        "NUM_DQ": "i32",
        **dict.fromkeys(("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "D"), "constexpr"),
    }
    rows = []
    for hd in HEAD_DIMS:
        t = choose_tiles(hd, T4, T4)
        d = rounded_head_dim(hd)
        got = shared(fwd, fsig, {"BLOCK_M": t.block_m, "BLOCK_N": t.block_n, "D": d})
        rows.append([hd, "fwd", f"{t.block_m}x{t.block_n}", fwd_smem_bytes(t.block_m, t.block_n, hd), got])
        tiles = (t.block_m1, t.block_n1, t.block_m2, t.block_n2)
        got = shared(bwd, bsig, dict(zip(("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2"), tiles), D=d))
        rows.append([hd, "bwd", "/".join(map(str, tiles)), bwd_smem_bytes(*tiles, hd), got])
    return rows


def flex_rows() -> list[list]:
    import torch
    import triton
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rows: list[list] = []
    seen: set[int] = set()  # generated modules outlive dynamo.reset(): measure each kernel once, under its head_dim
    for hd in HEAD_DIMS:
        torch._dynamo.reset()
        gc.collect()
        t = choose_tiles(hd, T4, T4)
        q, k, v = (
            torch.randn(1, h, 1024, hd, device="cuda", dtype=torch.float16, requires_grad=True) for h in (8, 4, 4)
        )
        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 1024, 1024, device="cuda")
        fn = torch.compile(flex_attention, dynamic=False)
        fn(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=t.kernel_options()).sum().backward()
        torch.cuda.synchronize()
        for tuner in [o for o in gc.get_objects() if isinstance(o, CachingAutotuner) and id(o) not in seen]:
            seen.add(id(tuner))
            for cfg in tuner.configs:
                meta = tuner._create_compile_meta(cfg)
                consts = meta["constants"]
                if "BLOCK_M1" in consts:
                    kind, tiles = "bwd", tuple(consts[n] for n in ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2"))
                    est = bwd_smem_bytes(*tiles, hd)
                elif "BLOCK_M" in consts and "SPARSE_KV_BLOCK_SIZE" in consts:
                    kind, tiles = "fwd", (consts["BLOCK_M"], consts["BLOCK_N"])
                    est = fwd_smem_bytes(*tiles, hd)
                else:
                    continue
                opts = (
                    tuner._create_compile_options(cfg, meta)
                    if hasattr(tuner, "_create_compile_options")
                    else {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
                )
                try:
                    try:
                        src = ASTSource(tuner.fn, meta["signature"], consts, meta["configs"][0])
                    except (TypeError, KeyError, IndexError):
                        src = ASTSource(tuner.fn, meta["signature"], constexprs=consts)
                    got = triton.compile(src, target=GPUTarget("cuda", 75, 32), options=opts).metadata.shared
                except Exception as e:  # noqa: BLE001 - report the kernel that would not recompile, go on
                    print(f"sm75 recompile failed for head_dim {hd} {kind} {tiles}: {type(e).__name__}: {e}")
                    continue
                label = ("x" if kind == "fwd" else "/").join(map(str, tiles))
                rows.append([hd, kind, f"{label} w{cfg.num_warps} s{cfg.num_stages}", est, got])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flex", action="store_true", help="flex's own kernels (needs CUDA)")
    parser.add_argument("--mimic", action="store_true", help="kernels with flex's structure (no GPU needed)")
    args = parser.parse_args()
    rows = [["mimic", *r] for r in (mimic_rows() if args.mimic or not args.flex else [])]
    if args.flex:
        try:
            rows += [["flex", *r] for r in flex_rows()]
        except Exception:  # noqa: BLE001 - inductor internals differ between torch versions: say so, keep the rest
            import traceback

            traceback.print_exc()
            print("flex: could not collect flex's kernels on this torch; the mimic rows stand alone")
    print("| source | head_dim | kernel | tiles | estimate B | sm75 shared B | fits 64 KB |")
    print("|---|---|---|---|---|---|---|")
    bad = 0
    for src, hd, kind, tiles, est, got in rows:
        bad += got > T4
        print(f"| {src} | {hd} | {kind} | {tiles} | {est} | {got} | {'yes' if got <= T4 else 'NO'} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
