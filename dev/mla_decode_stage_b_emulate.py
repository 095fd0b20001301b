"""CPU emulation of mla_decode_stage_b_wide's index math and loop control (src/cuda/mla_decode.cu).

Why: the wide stage-B kernel was written without a GPU at hand. This walks every (block, warp) of
its grid in the kernel's order: warp tiles of kN8 n8 tiles, weight steps of kL K-blocks double-
buffered with the kernel's break conditions, zeros past R and past the last row, stores guarded by
T and the row count. One K-block's MMAs are taken as a [16, 32] @ [32, 8] product per token tile
(the fragment layout inside it is mma_block's, shared with the one-tile kernel that ran on the
H200). Small integer inputs make the comparison exact; every output must be written once.
Run: .venv/bin/python dev/mla_decode_stage_b_emulate.py
"""
import numpy as np

K_BLOCK, M_TILE, TILE_ROWS, WARPS = 32, 16, 8, 8
WIDE_N8 = 2  # tiles::kMlaDecodeWideN8Tiles


def wide_loads(m_tiles, n8):
    """kWideLoads<kM, kN8>: K-blocks per step and weight row."""
    return (2 if m_tiles == 4 else 4) * WIDE_N8 // n8


def emulate(tokens, rank, rows, m_tiles, n8, grid, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.integers(-3, 4, (tokens, rank)).astype(np.float64)  # [T, R]
    w = rng.integers(-3, 4, (rows, rank)).astype(np.float64)  # kv_b [rows, R]
    out = np.full((tokens, rows), np.nan)
    hits = np.zeros((tokens, rows), int)
    loads = wide_loads(m_tiles, n8)
    step = loads * K_BLOCK
    tiles = -(-rows // (TILE_ROWS * n8))
    stride = grid * WARPS

    def rows_of(tile):  # [n8][g]: kv_b row or None
        return [[(tile * n8 + j) * TILE_ROWS + g if (tile * n8 + j) * TILE_ROWS + g < rows
                 else None for g in range(8)] for j in range(n8)]

    def load(rws, k0):  # [n8][8 rows][loads, 32 columns], zeros past R or past the last row
        buf = np.zeros((n8, 8, loads, K_BLOCK))
        for j in range(n8):
            for g, r in enumerate(rws[j]):
                for l in range(loads):
                    for q in range(4):
                        k = k0 + l * K_BLOCK + 8 * q
                        if r is not None and k < rank:
                            buf[j, g, l, 8 * q:8 * q + 8] = w[r, k:k + 8]
        return buf

    def mma(acc, buf, k0):
        for l in range(loads):
            kb = k0 + l * K_BLOCK
            if kb >= rank:
                break
            for m in range(m_tiles):
                a = np.zeros((M_TILE, K_BLOCK))
                for i in range(M_TILE):
                    t = m * M_TILE + i
                    for q in range(4):
                        k = kb + 8 * q
                        if t < tokens and k < rank:
                            a[i, 8 * q:8 * q + 8] = c[t, k:k + 8]
                for j in range(n8):
                    acc[j, m] += a @ buf[j, :, l, :].T

    for block in range(grid):
        for warp in range(WARPS):
            first = block * WARPS + warp
            rws = rows_of(first)
            wa = load(rws, 0)
            for tile in range(first, tiles, stride):
                if tile != first:
                    rws = rows_of(tile)
                    wa = load(rws, 0)
                acc = np.zeros((n8, m_tiles, M_TILE, 8))
                for k0 in range(0, rank, 2 * step):
                    k1 = k0 + step
                    if k1 < rank:
                        wb = load(rws, k1)
                    mma(acc, wa, k0)
                    if k1 >= rank:
                        break
                    if k1 + step < rank:
                        wa = load(rws, k1 + step)
                    mma(acc, wb, k1)
                for j in range(n8):
                    n0 = (tile * n8 + j) * TILE_ROWS
                    for m in range(m_tiles):
                        for i in range(M_TILE):
                            for g in range(8):
                                t, n = m * M_TILE + i, n0 + g
                                if t < tokens and n < rows:
                                    out[t, n] = acc[j, m, i, g]
                                    hits[t, n] += 1
    return np.array_equal(out, c @ w.T) and bool((hits == 1).all())


if __name__ == "__main__":
    # (T, R, kv_b rows, token tiles, n8 tiles per warp tile, blocks): partial K-blocks (R = 40,
    # 520, 8), half-full last warp tiles (120, 248 rows), more warp tiles than warps (a second
    # pass), fewer (idle warps), one and two n8 tiles at two and four token tiles.
    cases = [(17, 40, 120, 2, 1, 2), (17, 40, 120, 2, 2, 1), (64, 40, 120, 4, 2, 1),
             (64, 40, 120, 4, 1, 2), (33, 520, 248, 4, 2, 1), (63, 520, 264, 4, 2, 1),
             (20, 96, 200, 2, 2, 1), (20, 8, 24, 2, 2, 1), (48, 64, 40, 4, 1, 1),
             (32, 512, 256, 2, 2, 1)]
    bad = [case for case in cases if not emulate(*case)]
    print(f"{len(cases) - len(bad)} of {len(cases)} cases exact"
          + (f"; failed: {bad}" if bad else ""))
    raise SystemExit(1 if bad else 0)
