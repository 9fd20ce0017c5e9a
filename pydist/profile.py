"""Where the native engine's step spends its time: each layer's forward and backward, in time and GFLOP/s,
beside this core's float32 GEMM peak.

    python -m pydist.profile                                   # LeNet-5 at batch 64 and 256
    python -m pydist.profile --model mlp --hidden 1024 1024 --batch-size 64
    python -m pydist.train --profile ...                       # the same, for train's model and batch

One process, one core, no MPI: the step is the engine's own (Engine.profile times each layer of real
forward and backward passes on random data, taking the fastest of --reps for each). The peak is the
fastest of 2048 x 2048 GEMMs through the engine's own BLAS, which is what the step's GEMMs run on.
A ReLU that feeds a max-pool runs inside it (one pass); its time is the pool's.
"""
import argparse
import os

import numpy as np

from . import _C
from .engine import _CONV2D, _LINEAR, _MAXPOOL2D, _RELU, layer_costs, lenet5, mlp


def peak_gflops(n=2048, reps=5):
    """This core's float32 GEMM rate through the engine's BLAS (one thread): the fastest of reps."""
    return 2.0 * n ** 3 / _C.sgemm_seconds(n, reps) / 1e9


def _name(spec):
    kind, a, b, k, stride, pad = spec
    if kind == _CONV2D:
        return f"conv2d {a}->{b} {k}x{k}" + (f" pad {pad}" if pad else "") + (f" stride {stride}" if stride > 1 else "")
    if kind == _LINEAR:
        return f"linear {a}->{b}"
    if kind == _MAXPOOL2D:
        return f"maxpool2d {k}"
    return ("relu", "flatten")[kind - _RELU]


def profile(model, batch, reps=50, seed=0):
    """Per layer of `model` at `batch`: {name, forward_s, backward_s, forward_flops, backward_flops}, the
    fastest of `reps` steps each; then a last row, the loss (log-softmax + NLL and its gradient)."""
    engine = _C.Engine(model.specs(), model.input_shape, batch)
    engine.init_params(seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, int(np.prod(model.input_shape))), dtype=np.float32)
    labels = rng.integers(0, engine.classes, batch, dtype=np.int32)
    engine.profile(x, labels, 5)   # warm: the first steps fault pages in and grow BLAS' buffers
    forward, backward, loss = engine.profile(x, labels, reps)
    specs, fwd_flops = model.specs(), engine.layer_flops
    rows = []
    for spec, f, b, per_example, total in zip(specs, forward, backward, fwd_flops, layer_costs(model)):
        rows.append({"name": _name(spec), "forward_s": f, "backward_s": b, "forward_flops": per_example * batch,
                     "backward_flops": (total - per_example) * batch})
    rows.append({"name": "loss", "forward_s": loss, "backward_s": 0.0, "forward_flops": 0.0,
                 "backward_flops": 0.0})
    return rows


def table(rows, peak, title):
    """The profile as text: per layer forward and backward ms and GFLOP/s, the share of the step, and
    the step's total against the peak."""
    total = sum(r["forward_s"] + r["backward_s"] for r in rows)
    flops = sum(r["forward_flops"] + r["backward_flops"] for r in rows)

    def rate(f, s):
        return f"{f / s / 1e9:9.1f}" if f > 0 and s > 0 else f"{'':9}"

    lines = [title, f"{'layer':24} {'fwd ms':>8} {'GFLOP/s':>9} {'bwd ms':>8} {'GFLOP/s':>9} {'step %':>7}",
             "-" * 70]
    for r in rows:
        share = 100 * (r["forward_s"] + r["backward_s"]) / total
        lines.append(f"{r['name']:24} {r['forward_s'] * 1e3:8.3f} {rate(r['forward_flops'], r['forward_s'])} "
                     f"{r['backward_s'] * 1e3:8.3f} {rate(r['backward_flops'], r['backward_s'])} {share:7.1f}")
    lines.append("-" * 70)
    gflops = flops / total / 1e9
    lines.append(f"step {total * 1e3:.3f} ms: {gflops:.1f} GFLOP/s, {100 * gflops / peak:.1f}% of the {peak:.0f} GFLOP/s "
                 "peak")
    return "\n".join(lines)


def simd_summary():
    """The instruction-set level the vector kernels run at, and why: 'avx2 (the widest this CPU runs)'
    or 'sse2 (PYDIST_SIMD=sse2; this CPU runs avx2)'."""
    info = _C.simd_info()
    if info["level"] == info["cpu"]:
        return f"{info['level']} (the widest this CPU runs; PYDIST_SIMD=sse2|avx2|avx512 caps it)"
    return f"{info['level']} (PYDIST_SIMD={os.environ.get('PYDIST_SIMD')}; this CPU runs {info['cpu']})"


def report(model, batches, reps=50):
    """The tables for `model` at each batch size, with the peak and BLAS kernels they are measured against."""
    peak = peak_gflops()
    out = [f"engine's kernels: {simd_summary()}",
           f"engine's BLAS: OpenBLAS {_C.blas_core()} kernels, peak {peak:.1f} GFLOP/s (2048^3 GEMM, one thread)"]
    for batch in batches:
        out.append("")
        out.append(table(profile(model, batch, reps), peak, f"{model.name}, batch {batch} (fastest of {reps})"))
    return "\n".join(out)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m pydist.profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("lenet5", "mlp"), default="lenet5")
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 128], help="MLP hidden widths (default 256 128)")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[64, 256], help="default 64 256")
    ap.add_argument("--reps", type=int, default=50, help="steps timed per batch size; each layer's fastest counts")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if min(args.batch_size) < 1 or args.reps < 1:
        raise SystemExit("pydist.profile: --batch-size and --reps must be positive")
    model = lenet5() if args.model == "lenet5" else mlp(tuple(args.hidden))
    print(report(model, args.batch_size, args.reps), flush=True)


if __name__ == "__main__":
    main()
