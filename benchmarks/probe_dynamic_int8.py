# ruff: noqa: B023  (the candidates close over one shape's tensors, timed in that loop)
"""Per-layer probe (issue 37, dynamic int8): fbgemm's dynamic Linear against plain-tensor kernels.

One thread, CPU time (time.process_time), medians of interleaved rounds. Candidates:
  fbgemm       torch.ao.nn.quantized.dynamic.Linear (the baseline)
  int_mm       fxloom_q.linear_int8(dynamic=True) as of main: per-token int8, aten._int_mm
  onednn_pt    per-tensor asymmetric uint8 (aminmax in the call), onednn.qlinear_pointwise
  onednn_tok   per-token symmetric int8 fed to onednn with scale 1, row scales applied after
               (measured 2026-12-07: 500-5800x fbgemm -- oneDNN has no fast path for int8
               (signed) activations here; error only, not timed)
  w8pack_fp32  aten._weight_int8pack_mm with fp32 activations (measured 12-180x fbgemm;
               error only, not timed)
  fxloom       fxloom_q.linear_int8(dynamic=True, activations="per_tensor"): the kernel row
Run: python benchmarks/probe_dynamic_int8.py
"""

import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, ".")
from fxloom.quantize import ops  # noqa: E402

torch.set_num_threads(1)
torch.manual_seed(0)

SHAPES = [  # (label, M, K, N)
    ("bert qkv/out 768->768", 128, 768, 768),
    ("bert ffn1 768->3072", 128, 768, 3072),
    ("bert ffn2 3072->768", 128, 3072, 768),
    ("deeprec 17768->512 b1", 1, 17768, 512),
    ("deeprec 512->1024 b1", 1, 512, 1024),
    ("deeprec 512->17768 b1", 1, 512, 17768),
    ("deeprec 17768->512 b64", 64, 17768, 512),
    ("deeprec 512->1024 b64", 64, 512, 1024),
    ("deeprec 512->17768 b64", 64, 512, 17768),
]


def per_channel(w):
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    return torch.clamp(torch.round(w / scale[:, None]), -128, 127).to(torch.int8), scale


def onednn_per_tensor(x, packed, w_scale, wzp, bias):
    low, high = torch.aminmax(x)
    low, high = min(low.item(), 0.0), max(high.item(), 0.0)
    scale = max((high - low) / 255.0, 1e-8)
    zp = int(min(max(round(-low / scale), 0), 255))
    q = torch.clamp(torch.round(x * (1.0 / scale)) + zp, 0, 255).to(torch.uint8)
    return torch.ops.onednn.qlinear_pointwise(
        q, scale, zp, packed, w_scale, wzp, bias, 1.0, 0, torch.float32, "none", [], ""
    )


def onednn_per_tensor_inplace(x, packed, w_scale, wzp, bias):
    low, high = torch.aminmax(x)
    low, high = min(low.item(), 0.0), max(high.item(), 0.0)
    scale = max((high - low) / 255.0, 1e-8)
    zp = int(min(max(round(-low / scale), 0), 255))
    q = x.mul(1.0 / scale).add_(zp).round_().clamp_(0, 255).to(torch.uint8)
    return torch.ops.onednn.qlinear_pointwise(
        q, scale, zp, packed, w_scale, wzp, bias, 1.0, 0, torch.float32, "none", [], ""
    )


def onednn_choose(x, packed, w_scale, wzp, bias):
    scale, zp = torch._choose_qparams_per_tensor(x, False)
    q = x.mul(1.0 / scale).add_(zp).round_().clamp_(0, 255).to(torch.uint8)
    return torch.ops.onednn.qlinear_pointwise(
        q, scale, zp, packed, w_scale, wzp, bias, 1.0, 0, torch.float32, "none", [], ""
    )


def onednn_qpt(x, packed, w_scale, wzp, bias):
    scale, zp = torch._choose_qparams_per_tensor(x, False)
    q = torch.quantize_per_tensor(x, scale, zp, torch.quint8).int_repr()
    return torch.ops.onednn.qlinear_pointwise(
        q, scale, zp, packed, w_scale, wzp, bias, 1.0, 0, torch.float32, "none", [], ""
    )


def onednn_token(x, packed, w_scale, wzp, bias):
    q, row = ops.per_token_symmetric(x)
    out = torch.ops.onednn.qlinear_pointwise(
        q, 1.0, 0, packed, w_scale, wzp, None, 1.0, 0, torch.float32, "none", [], ""
    )
    return out.mul_(row) if bias is None else torch.addcmul(bias, out, row)


def cpu_ms(fn, inner):
    start = time.process_time()
    for _ in range(inner):
        fn()
    return (time.process_time() - start) * 1000 / inner


def main():
    for label, m, k, n in SHAPES:
        lin = nn.Linear(k, n)
        x = torch.randn(m, k)
        ref = lin(x).detach()
        fb = torch.ao.quantization.quantize_dynamic(nn.Sequential(lin), {nn.Linear}, torch.qint8)
        w8, ws = per_channel(lin.weight.detach())
        bias = lin.bias.detach()
        packed = torch.ops.onednn.qlinear_prepack(w8, None)
        wzp = torch.zeros(n, dtype=torch.int64)
        cands = {
            "fbgemm": lambda: fb(x),
            "int_mm": lambda: ops.linear_int8(x, 0.0, 0, w8, ws, bias, 0.0, 0, False, True),
            "onednn_pt": lambda: onednn_per_tensor(x, packed, ws, wzp, bias),
            "onednn_pt_inpl": lambda: onednn_per_tensor_inplace(x, packed, ws, wzp, bias),
            "onednn_choose": lambda: onednn_choose(x, packed, ws, wzp, bias),
            "onednn_qpt": lambda: onednn_qpt(x, packed, ws, wzp, bias),
            "onednn_tok": lambda: onednn_token(x, packed, ws, wzp, bias),
            "w8pack_fp32": lambda: torch.ops.aten._weight_int8pack_mm(x, w8, ws) + bias,
            "fxloom": lambda: ops.linear_int8(
                x, 0.0, 0, w8, ws, bias, 0.0, 0, False, True, "per_tensor"
            ),
        }
        untimed = ("onednn_tok", "w8pack_fp32")
        errs = {}
        with torch.no_grad():
            for name, fn in cands.items():
                try:
                    out = fn()
                    errs[name] = ((out - ref).norm() / ref.norm()).item()
                except Exception as e:  # noqa: BLE001
                    errs[name] = f"fails: {str(e).splitlines()[0][:80]}"
            live = {
                nm: f
                for nm, f in cands.items()
                if not isinstance(errs[nm], str) and nm not in untimed
            }
            inner = max(1, int(20 / max(1, m * k * n / 2e7)))
            times = {nm: [] for nm in live}
            for _ in range(7):
                for nm, f in live.items():
                    times[nm].append(cpu_ms(f, inner))
        base = statistics.median(times["fbgemm"])
        print(f"\n{label}  (M={m} K={k} N={n}; inner {inner})")
        for nm in cands:
            if isinstance(errs[nm], str):
                print(f"  {nm:15s} {errs[nm]}")
                continue
            if nm in untimed:
                print(f"  {nm:15s} (not timed)  rel err {errs[nm]:.2e}")
                continue
            med = statistics.median(times[nm])
            print(
                f"  {nm:15s} {med:8.3f} ms  {med / base:5.2f}x fbgemm  rel err {errs[nm]:.2e}"
                f"  ({errs[nm] / errs['fbgemm']:.2f}x fbgemm's)"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
