"""Emulator (not shipped) of cuda-mla-decode's one-token-tile stage B loop, stage_b_ring in
src/cuda/mla_decode.cu: each warp walks its (tile, step) positions; K-block j's registers are
tagged with the (row, column) they were loaded from, every MMA checks it consumes its own row's
columns, and each output is written exactly once with A @ W^T on integer inputs (exact in float64).
The grid is blocks x 8 warps over 8-row tiles, as the launcher's (tiles / 8 capped at 4 x SMs).
    .venv/bin/python dev/mla_decode_ring_emulate.py
"""
import numpy as np

K_BLOCK, TILE_ROWS, WARPS = 32, 8, 8


def run(b_rows, rank, tokens, blocks, loads, rng):
    w_kvb = rng.integers(-3, 4, size=(b_rows, rank)).astype(np.float64)  # [H (dn + dv), R]
    c = rng.integers(-3, 4, size=(tokens, rank)).astype(np.float64)      # [T, R]
    out = np.full((tokens, b_rows), np.nan)
    writes = np.zeros((tokens, b_rows), int)
    tiles = -(-b_rows // TILE_ROWS)
    stride = blocks * WARPS
    step = loads * K_BLOCK

    def load(tile, k0, g, q, j):  # what load_or_zero reads into K-block j's registers, or None
        n, k = tile * TILE_ROWS + g, k0 + j * K_BLOCK + 8 * q
        return (n, k) if tile < tiles and n < b_rows and k < rank else None

    for first in range(blocks * WARPS):
        regs = {(g, q): [load(first, 0, g, q, j) for j in range(loads)]
                for g in range(8) for q in range(4)}
        tile, k0, acc = first, 0, None
        while tile < tiles:
            next_tile, next_k0 = tile, k0 + step
            if next_k0 >= rank:
                next_tile, next_k0 = tile + stride, 0
            if k0 == 0:
                acc = np.zeros((16, 8))
            for j in range(loads):
                kb = k0 + j * K_BLOCK
                if kb < rank:
                    for g in range(8):
                        n = tile * TILE_ROWS + g
                        for q in range(4):
                            k = kb + 8 * q
                            if k >= rank:  # A's vector past R is zeros (R % 8 == 0)
                                continue
                            slot = regs[(g, q)][j]
                            if n < b_rows:
                                assert slot == (n, k), (slot, n, k)
                                acc[:tokens, g] += c[:, k:k + 8] @ w_kvb[n, k:k + 8]
                            else:
                                assert slot is None
                for g in range(8):
                    for q in range(4):
                        regs[(g, q)][j] = load(next_tile, next_k0, g, q, j)
            if next_k0 == 0:
                for g in range(8):
                    n = tile * TILE_ROWS + g
                    if n < b_rows:
                        out[:, n] = acc[:tokens, g]
                        writes[:, n] += 1
            tile, k0 = next_tile, next_k0
    assert (writes == 1).all(), "every output written once"
    assert np.array_equal(out, c @ w_kvb.T)


def main():
    rng = np.random.default_rng(0)
    # (kv_b rows, R, T, blocks, K-blocks per step): warps with two or more tiles, partial steps
    # and K-blocks (R = 8, 40, 264, 520), idle warps, half-full last tiles, T = 1 / 9 / 16.
    shapes = [(1008, 264, 3, 10, 4), (100, 8, 1, 1, 4), (224, 64, 16, 2, 4), (333, 520, 5, 3, 4),
              (512, 512, 2, 4, 4), (17, 40, 9, 1, 4), (1000, 264, 4, 3, 4), (64, 128, 1, 16, 4)]
    for s in shapes:
        run(*s, rng)
        print("exact", s)


if __name__ == "__main__":
    main()
