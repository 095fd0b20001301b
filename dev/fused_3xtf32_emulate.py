"""Emulates, in float64 on the CPU, the index arithmetic of cuda-fused's 3xTF32 kernel with its
operands staged in shared memory (src/cuda/fused_fp32_tensor_core.cu, kv_proj_fused_3xtf32): the
staging plan with its zero fills (padding never written stays NaN, so reading it shows), every
lane's A and B fragment reads, mma.sync m16n8k8's fragment layout, the partials' reduction and the
stores. Checks the result against the plain product, so a wrong offset, stride or fragment map
shows without a GPU. The tf32 splits are not emulated (they move no element). Needs numpy.
    python3 dev/fused_3xtf32_emulate.py     (session 9, 2026-12-02: every case ok)
"""
import itertools
import numpy as np

WARPS, TOKENS, WARP_ROWS, MAX_RANK = 16, 8, 16, 64
LATENT_STRIDE = MAX_RANK + 4


def round_up(x, m):
    return (x + m - 1) // m * m


def mma(acc, a, b):
    """acc[16x8] += A[16x8] @ B[8x8], from per-lane fragments (PTX m16n8k8 .tf32 layout)."""
    A = np.zeros((16, 8))
    B = np.zeros((8, 8))
    for lane in range(32):
        g, q = lane // 4, lane % 4
        A[g, q], A[g + 8, q], A[g, q + 4], A[g + 8, q + 4] = a[lane]
        B[q, g], B[q + 4, g] = b[lane]
    C = A @ B
    for lane in range(32):
        g, q = lane // 4, lane % 4
        acc[lane] += [C[g, 2 * q], C[g, 2 * q + 1], C[g + 8, 2 * q], C[g + 8, 2 * q + 1]]


def run(T, D, R, N, per_block, rng):
    hidden = rng.standard_normal((T, D))
    w_down = rng.standard_normal((D, R))
    w_up = rng.standard_normal((R, 2 * N))  # [w_up_k | w_up_v]
    want = hidden @ w_down @ w_up
    out = np.full((T, 2 * N), np.nan)
    down_rows, rank_cols = round_up(D, 16), round_up(R, 16)
    rank_stride, up_rows = rank_cols + 8, round_up(R, 8)
    up_cols = 16 * per_block
    column_stride, hidden_cols, hidden_stride = up_cols + 8, down_rows, round_up(D, 32) + 4
    assert rank_stride % 32 in (8, 24) and column_stride % 32 in (8, 24) and hidden_stride % 32 == 4
    num_tiles, up_tiles = -(-T // TOKENS), -(-2 * N // 16)
    down_tiles, up_steps = -(-R // 16), -(-R // 8)
    live_warps = -(-D // WARP_ROWS)
    for by in range(-(-up_tiles // per_block)):
        column0 = by * up_cols
        wd = np.full(down_rows * rank_stride, np.nan)  # padding never written stays NaN
        for k, c in itertools.product(range(down_rows), range(0, rank_cols, 4)):
            for e in range(4):
                wd[k * rank_stride + c + e] = w_down[k, c + e] if k < D and c < R else 0.0
        wu = np.full(up_rows * column_stride, np.nan)
        for r, c in itertools.product(range(up_rows), range(0, up_cols, 4)):
            for e in range(4):
                j = column0 + c + e
                wu[r * column_stride + c + e] = w_up[r, j] if r < R and column0 + c < 2 * N else 0.0
        for tile in range(num_tiles):
            token0 = tile * TOKENS
            hs = np.full(TOKENS * hidden_stride, np.nan)
            for t, c in itertools.product(range(TOKENS), range(0, hidden_cols, 4)):
                for e in range(4):
                    ok = token0 + t < T and c < D
                    hs[t * hidden_stride + c + e] = hidden[token0 + t, c + e] if ok else 0.0
            partial = np.zeros((WARPS, TOKENS, MAX_RANK))
            for warp in range(WARPS):
                if warp * WARP_ROWS >= D:
                    continue
                down = [[np.zeros(4) for _ in range(32)] for _ in range(4)]
                for s in range(2):
                    b = []
                    a_t = [[None] * 32 for _ in range(4)]
                    for lane in range(32):
                        g, q = lane // 4, lane % 4
                        b_row = g * hidden_stride + WARP_ROWS * warp + q
                        b.append((hs[b_row + 8 * s], hs[b_row + 8 * s + 4]))
                        a_rows = (WARP_ROWS * warp + q) * rank_stride + g
                        row0 = a_rows + 8 * s * rank_stride
                        row4 = row0 + 4 * rank_stride
                        for t in range(down_tiles):
                            a_t[t][lane] = (wd[row0 + 16 * t], wd[row0 + 16 * t + 8],
                                            wd[row4 + 16 * t], wd[row4 + 16 * t + 8])
                    for t in range(down_tiles):
                        mma(down[t], a_t[t], b)
                for t in range(down_tiles):
                    for lane in range(32):
                        g, q = lane // 4, lane % 4
                        r = 16 * t + g
                        partial[warp, 2 * q, r] = down[t][lane][0]
                        partial[warp, 2 * q + 1, r] = down[t][lane][1]
                        partial[warp, 2 * q, r + 8] = down[t][lane][2]
                        partial[warp, 2 * q + 1, r + 8] = down[t][lane][3]
            latent = np.full((TOKENS, LATENT_STRIDE), np.nan)
            for token, r in itertools.product(range(TOKENS), range(8 * up_steps)):
                latent[token, r] = partial[:live_warps, token, r].sum() if r < R else 0.0
            for warp in range(WARPS):
                if not (warp < per_block and column0 // 16 + warp < up_tiles):
                    continue
                up = [np.zeros(4) for _ in range(32)]
                for s in range(up_steps):
                    a, b = [], []
                    for lane in range(32):
                        g, q = lane // 4, lane % 4
                        b.append((latent[g, 8 * s + q], latent[g, 8 * s + q + 4]))
                        u = q * column_stride + WARP_ROWS * warp + g
                        row0 = u + 8 * s * column_stride
                        row4 = row0 + 4 * column_stride
                        a.append((wu[row0], wu[row0 + 8], wu[row4], wu[row4 + 8]))
                    mma(up, a, b)
                for lane in range(32):
                    g, q = lane // 4, lane % 4
                    for low in range(2):
                        j = column0 + 16 * warp + g + 8 * low
                        for c in range(2):
                            t = token0 + 2 * q + c
                            if j < 2 * N and t < T:
                                out[t, j] = up[lane][2 * low + c]
    err = np.abs(out - want).max() / np.abs(want).max()
    return err


if __name__ == "__main__":
    rng = np.random.default_rng(20261202)
    for T, D, R, N, per_block in [(3, 256, 48, 128, 8), (9, 256, 48, 128, 16), (17, 100, 40, 36, 4),
                                  (8, 32, 64, 8, 1), (5, 256, 64, 132, 16), (2, 4, 4, 4, 1),
                                  (11, 48, 12, 20, 2)]:
        err = run(T, D, R, N, per_block, rng)
        status = "ok" if err < 1e-12 else "WRONG"
        print(f"T={T} D={D} R={R} N={N} tiles/block={per_block}: max relative error {err:.1e} {status}")
