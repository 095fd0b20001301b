"""What each layer between Python and latentkv::run costs per call (issue 14: the founding module
call from Python within 1.5x of the bare binding's call on a preallocated output).

Times, back to back and sampled in rounds (one block of calls of every variant per round, so no
variant inherits another's state), the 'host' case of python/bench/bench_torch.py (B=S=1, D=64,
R=16, H=1, Dh=16: a call whose work is negligible, so the wall time is the host's cost):
  binding   latentkv._C.kv_proj on a preallocated output (the baseline)
  op        torch.ops.latentkv.kv_proj.default (the OpOverload)
  packet    torch.ops.latentkv.kv_proj (the OpOverloadPacket)
  kv_proj   latentkv.torch.kv_proj
  module    LatentKVProjection under torch.no_grad()
  empty     torch.empty of the output's shape (what allocating the output costs from Python)
  aten_op   torch.ops.aten.view.default (an aten op of about the same arity, for scale)
and prints per variant the median over rounds of the mean per-call time, the fastest round, and
the ratio to the binding. To compare builds of the C++ ops, copy python/latentkv with each
build's _C and _torch_ops.so into its own directory, put it first on PYTHONPATH, and alternate the
builds a few times; on a loaded CPU machine --clock thread keeps the spread within ~2%.

    .venv/bin/python dev/torch_call_overhead.py [--device cpu|cuda] [--iters 20000] [--rounds 15]
                                                [--clock wall|thread]
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "bench"))
from bench_torch import CLOCKS, interleaved_wall_us  # noqa: E402

import latentkv.torch as lt  # noqa: E402
from latentkv import _C  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=20000, help="calls per sample")
    parser.add_argument("--rounds", type=int, default=15, help="samples per variant")
    parser.add_argument("--clock", choices=CLOCKS, default="wall",
                        help="wall time, or this thread's CPU time (CPU only: steadier on a loaded "
                        "machine, since time spent preempted is not counted)")
    args = parser.parse_args()

    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    b, s, d, r, h, dh = 1, 1, 64, 16, 1, 16
    torch.manual_seed(0)
    module = lt.LatentKVProjection(d, r, h, dh, device=device)
    x = torch.randn(b, s, d, device=device)
    w_down, w_up_k, w_up_v = (p.detach() for p in module.parameters())
    out = torch.empty(2, b, s, h, dh, device=device)
    wanted = _C.workspace_size(x, w_down, w_up_k, w_up_v, out)
    workspace = torch.empty(wanted, device=device, dtype=torch.uint8) if wanted else None
    op = torch.ops.latentkv.kv_proj.default
    packet = torch.ops.latentkv.kv_proj
    view = torch.ops.aten.view.default
    shape = (2, b, s, h, dh)
    fns = {
        "binding": lambda: _C.kv_proj(x, w_down, w_up_k, w_up_v, out, workspace=workspace),
        "op": lambda: op(x, w_down, w_up_k, w_up_v, h),
        "packet": lambda: packet(x, w_down, w_up_k, w_up_v, h),
        "kv_proj": lambda: lt.kv_proj(x, w_down, w_up_k, w_up_v, h),
        "module": lambda: module(x),
        "empty": lambda: torch.empty(shape, device=device),
        "aten_op": lambda: view(out, shape),
    }
    with torch.no_grad():
        torch.testing.assert_close(module(x), lt.reference_kv_proj(x, w_down, w_up_k, w_up_v, h))
        times = interleaved_wall_us(fns, args.iters, args.rounds, sync, CLOCKS[args.clock])
    base = times["binding"][0]
    print(f"torch {torch.__version__}, latentkv from {Path(lt.__file__).parent}, device {device}, "
          f"{args.clock} clock, {args.rounds} rounds of {args.iters} calls; us per call: median "
          "(fastest round), x binding")
    for key, (med, fastest, _) in times.items():
        print(f"  {key:<9}{med:7.2f} ({fastest:5.2f})  {med / base:5.2f}x")


if __name__ == "__main__":
    main()
