"""Tensor parallelism over heads (issue 15, deliverable 5): two torch.distributed processes (gloo,
CPU) each pass their heads' rows of kv_b_proj.weight to latentkv.torch.mla_kv (q_a, kv_a and the
cache replicated) and get their heads' K and V; gathered, the shards equal the unsharded result,
and every rank's cache and q_a equal the unsharded ones."""

import os
import socket

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

WORLD = 2
SHAPE = (2, 5, 32, 12, 8, 6, 6, 4, 10)  # (B, S, D, R, dr, H, dn, dv, Rq): 3 heads per rank


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, port, result_dir):
    import latentkv.torch as lt
    from mla_common import layer, split_call
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        b, s, d, r, dr, h, dn, dv, rq = SHAPE
        args = layer(*SHAPE, seed=21)  # the same weights and inputs on every rank
        pos, kw = split_call(args)
        local = h // WORLD
        rows = pos[3].view(h, dn + dv, r)[rank * local:(rank + 1) * local].reshape(-1, r)
        cache = torch.full((b * s, r + dr), float("nan"))
        k, v, q_a = lt.mla_kv(pos[0], pos[1], pos[2], rows, local, kv_cache=cache, **kw)
        ks, vs = [torch.empty_like(k) for _ in range(WORLD)], [torch.empty_like(v)
                                                               for _ in range(WORLD)]
        dist.all_gather(ks, k.contiguous())
        dist.all_gather(vs, v.contiguous())
        if rank == 0:
            torch.save({"k": torch.cat(ks, dim=2), "v": torch.cat(vs, dim=2), "q_a": q_a,
                        "cache": cache}, os.path.join(result_dir, "gathered.pt"))
        torch.save({"q_a": q_a, "cache": cache}, os.path.join(result_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_head_shards_equal_the_unsharded_result(tmp_path, monkeypatch):
    import latentkv.torch as lt
    from mla_common import layer, split_call
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    # The spawned processes import this module and mla_common from here.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [tests_dir] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    mp.spawn(rank_main, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    b, s, d, r, dr, h, dn, dv, rq = SHAPE
    pos, kw = split_call(layer(*SHAPE, seed=21))
    cache = torch.full((b * s, r + dr), float("nan"))
    k, v, q_a = lt.mla_kv(*pos, kv_cache=cache, **kw)
    gathered = torch.load(tmp_path / "gathered.pt")
    assert torch.equal(gathered["k"], k) and torch.equal(gathered["v"], v)
    for rank in range(WORLD):
        replicated = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(replicated["q_a"], q_a) and torch.equal(replicated["cache"], cache)
