#!/usr/bin/env python3
"""PyTorch's layer norm and RMS norm kernels, timed for benches/norm_vs_cudnn.rs.

cuDNN's classic API has no layer or RMS norm, so oxidnn's are compared with PyTorch's on
the same machine, shapes and dtypes. Usage:

    python3 benches/torch_norms.py OUT.csv [--quick]

then run the Rust bench with OXIDNN_TORCH_CSV=OUT.csv to print both side by side.

What is timed (CUDA events around each call, on one stream):
  *.fwd  torch.nn.functional.layer_norm / rms_norm (weight, and bias for layer norm, of the
         data's dtype, as PyTorch users pass), under no_grad.
  *.bwd  the backward kernels only: aten.native_layer_norm_backward (dx, dweight, dbias) for
         layer norm; aten._fused_rms_norm_backward (dx, dweight) for RMS norm where this
         PyTorch has it, else torch.autograd.grad of F.rms_norm's output (every kernel of its
         backward graph; the CSV's `what` column says which).
Method as the Rust bench's: 5 warm-up calls, then 30 timed calls queued behind a stream
hold (torch.cuda._sleep), so the events measure device time, not Python overhead; median;
input sets rotate over >= 200 MiB and 4x the L2 so no call reads what the previous left in
cache. Inputs uniform in [-2, 2].
"""

import math
import statistics
import sys

SHAPES = [(8192, 1024), (8192, 4096), (32 * 12 * 512, 512)]
QUICK_SHAPES = [(8192, 1024)]
WARMUP = 5
RUNS = 30
ROTATION_MIN_BYTES = 200 << 20
EPS = 1e-5


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    out_path = sys.argv[1]
    quick = "--quick" in sys.argv[2:]
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"torch_norms: PyTorch not importable ({e}); nothing measured")
        return 1
    if not torch.cuda.is_available():
        print("torch_norms: no CUDA device; nothing measured")
        return 1
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    rotation = max(ROTATION_MIN_BYTES, 4 * l2)
    has_rms = hasattr(F, "rms_norm")
    fused_rms_bwd = hasattr(torch.ops.aten, "_fused_rms_norm_backward") and hasattr(
        torch.ops.aten, "_fused_rms_norm"
    )
    print(
        f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}) "
        f"on {props.name}; rms_norm: {'yes' if has_rms else 'no (torch < 2.4)'}"
    )
    # Cycles for the stream hold: long enough for Python to queue every timed call.
    clock_hz = 1.9e9
    try:
        clock_hz = torch.cuda.clock_rate() * 1e6 if hasattr(torch.cuda, "clock_rate") else clock_hz
    except Exception:
        pass
    hold_cycles = int(0.05 * clock_hz)

    def time_calls(calls):
        """Median device time (us) of calls[i % len(calls)]() over RUNS timed calls."""
        for i in range(WARMUP):
            calls[i % len(calls)]()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(RUNS)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(RUNS)]
        torch.cuda._sleep(hold_cycles)
        for i in range(RUNS):
            starts[i].record()
            calls[(WARMUP + i) % len(calls)]()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))

    rows_out = []
    for rows, d in QUICK_SHAPES if quick else SHAPES:
        for dtype, name in [(torch.float32, "f32"), (torch.float16, "f16")]:
            shape = f"{rows}x{d}"
            elem = torch.tensor([], dtype=dtype).element_size()
            set_bytes = 4 * rows * d * elem
            sets = max(1, math.ceil(rotation / set_bytes))
            gen = torch.Generator(device=dev).manual_seed(rows * 31 + d)

            def rand(*size):
                return (torch.rand(*size, device=dev, generator=gen, dtype=torch.float32) * 4 - 2).to(dtype)

            data = []
            for _ in range(sets):
                data.append({"x": rand(rows, d), "dy": rand(rows, d)})
            w = rand(d) * 0.25 + 1
            b = rand(d)
            for mode in ["layer_norm", "rms_norm"]:
                if mode == "rms_norm" and not has_rms:
                    rows_out.append((f"{mode}.fwd", name, shape, "", "torch < 2.4: no rms_norm"))
                    rows_out.append((f"{mode}.bwd", name, shape, "", "torch < 2.4: no rms_norm"))
                    continue
                try:
                    with torch.no_grad():
                        if mode == "layer_norm":
                            fwd = [lambda s=s: F.layer_norm(s["x"], (d,), w, b, EPS) for s in data]
                        else:
                            fwd = [lambda s=s: F.rms_norm(s["x"], (d,), w, EPS) for s in data]
                        us = time_calls(fwd)
                    rows_out.append((f"{mode}.fwd", name, shape, f"{us:.4f}", f"F.{mode}"))
                except Exception as e:  # noqa: BLE001 - report and go on
                    rows_out.append((f"{mode}.fwd", name, shape, "", f"error: {e}"[:200]))
                try:
                    us, what = time_backward(torch, F, mode, data, d, w, b, fused_rms_bwd, time_calls)
                    rows_out.append((f"{mode}.bwd", name, shape, f"{us:.4f}", what))
                except Exception as e:  # noqa: BLE001
                    rows_out.append((f"{mode}.bwd", name, shape, "", f"error: {e}"[:200]))
                for r in rows_out[-2:]:
                    print("  " + ",".join(r))
            del data
            torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        f.write(f"op,dtype,shape,torch_us,what,torch_version\n")
        for op, dt, shape, us, what in rows_out:
            what = what.replace(",", ";").replace("\n", " ")
            f.write(f"{op},{dt},{shape},{us},{what},{torch.__version__}\n")
    print(f"torch_norms: {len(rows_out)} rows -> {out_path}")
    return 0


def time_backward(torch, F, mode, data, d, w, b, fused_rms_bwd, time_calls):
    """Times the backward kernels of `mode`; returns (us, what was timed)."""
    aten = torch.ops.aten
    if mode == "layer_norm":
        prepared = []
        for s in data:
            _, mean, rstd = aten.native_layer_norm(s["x"], [d], w, b, EPS)
            prepared.append((s, mean, rstd))
        calls = [
            lambda p=p: aten.native_layer_norm_backward(
                p[0]["dy"], p[0]["x"], [d], p[1], p[2], w, b, [True, True, True]
            )
            for p in prepared
        ]
        with torch.no_grad():
            return time_calls(calls), "aten.native_layer_norm_backward (dx; dweight; dbias)"
    if fused_rms_bwd:
        try:
            prepared = []
            for s in data:
                _, rstd = aten._fused_rms_norm(s["x"], [d], w, EPS)
                prepared.append((s, rstd))
            calls = [
                lambda p=p: aten._fused_rms_norm_backward(
                    p[0]["dy"], p[0]["x"], [d], p[1], w, [True, True]
                )
                for p in prepared
            ]
            with torch.no_grad():
                return time_calls(calls), "aten._fused_rms_norm_backward (dx; dweight)"
        except Exception:  # noqa: BLE001 - signature differs: fall back to autograd
            pass
    graphs = []
    wg = w.detach().requires_grad_(True)
    for s in data:
        x = s["x"].detach().requires_grad_(True)
        graphs.append((F.rms_norm(x, (d,), wg, EPS), x, s["dy"]))
    calls = [
        lambda g=g: torch.autograd.grad(g[0], [g[1], wg], g[2], retain_graph=True) for g in graphs
    ]
    return time_calls(calls), "torch.autograd.grad of F.rms_norm (its whole backward graph)"


if __name__ == "__main__":
    sys.exit(main())
