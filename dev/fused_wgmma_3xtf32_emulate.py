# Emulates the index algebra (not the hardware) of the wgmma 3xTF32 kernels: the library kernel of
# dev/fused_wgmma_configuration.patch (any D <= 256 a multiple of 4, R <= 48, N) and, at the
# founding widths, dev/fused_wgmma_3xtf32_probe.cu's (the same layouts and permutations; its
# one-warpgroup down variant reads the same layout at other offsets). Shared-memory images as the
# kernels write them, wgmma's operand model (B(n, kappa) at start + (n/8) SBO + (kappa/4) LBO +
# (n%8) 16 + (kappa%4) 4; A fragments a0..a3 = (g, q), (g+8, q), (g, q+4), (g+8, q+4);
# accumulators d[4j..4j+3] = (g, 8j+2q), (g, 8j+2q+1), (g+8, 8j+2q), (g+8, 8j+2q+1)); prints each
# case's max error against float64 (~1e-13 when the algebra is right) and its unwritten (NaN)
# outputs. Run: python3 dev/fused_wgmma_3xtf32_emulate.py (numpy).
import numpy as np

rng = np.random.default_rng(1)


def b_of(mem, start_words, sbo, ncols):
    """B [8, ncols] of one K step as wgmma reads it from the words at start_words."""
    B = np.zeros((8, ncols))
    for n in range(ncols):
        for k in range(8):
            B[k, n] = mem[start_words + (n // 8) * (sbo // 4) + (k // 4) * 32 + (n % 8) * 4 + k % 4]
    return B


def run_general(hidden, w_down, w_up_k, w_up_v, wg_cols):
    """The library kernel's (src/cuda/fused_fp32_wgmma.cu) index algebra at any D <= 256 (a
    multiple of 4), R <= 48 and N: weights zero-filled past D, R and the block's columns, all 16
    K pairs of the down product, column blocks of 2 wg_cols."""
    T, D = hidden.shape
    R = w_down.shape[1]
    N = w_up_k.shape[1]
    DM, RC = 256, 48
    down_sbo, up_sbo = (DM // 4) * 128, (RC // 4) * 128
    block_cols = 2 * wg_cols
    out = np.full((2, T, N), np.nan)
    tiles = (T + 63) // 64
    for tile in range(tiles):
        for col0 in range(0, 2 * N, block_cols):
            cols = min(block_cols, 2 * N - col0)
            down = np.zeros(RC * DM)
            for i in range(RC * (DM // 4)):
                n, kq = i % RC, i // RC
                k = 16 * (kq // 4) + kq % 4
                at = (n // 8) * (down_sbo // 4) + kq * 32 + (n % 8) * 4
                for e in range(4):
                    down[at + e] = w_down[k + 4 * e, n] if n < R and k + 4 * e < D else 0.0
            up = np.zeros(block_cols * RC)
            for i in range(block_cols * (RC // 4)):
                n, kq = i % block_cols, i // block_cols
                j, h = kq // 2, kq % 2
                col = col0 + n
                for e in range(4):
                    r = 8 * j + 2 * e + h
                    val = 0.0
                    if n < cols and r < R:
                        val = w_up_k[r, col] if col < N else w_up_v[r, col - N]
                    up[(n // 8) * (up_sbo // 4) + kq * 32 + (n % 8) * 4 + e] = val
            rows = np.zeros((64, DM))
            t_hi = min(T, tile * 64 + 64)
            rows[: t_hi - tile * 64, :D] = hidden[tile * 64 : t_hi]

            latent = np.zeros((64, RC))
            for wg in range(2):
                dc = RC // 2
                acc = np.zeros((64, dc))
                for u in range(DM // 16):
                    for e in range(2):
                        A = np.zeros((64, 8))
                        for q in range(4):
                            A[:, q] = rows[:, 16 * u + 4 * q + 2 * e]
                            A[:, q + 4] = rows[:, 16 * u + 4 * q + 2 * e + 1]
                        B = b_of(down, (wg * dc // 8) * (down_sbo // 4) + (2 * u + e) * 64, down_sbo, dc)
                        acc += A @ B
                latent[:, wg * dc : (wg + 1) * dc] = acc
            for wg in range(2):
                acc = np.zeros((64, wg_cols))
                for j in range(RC // 8):
                    A = np.zeros((64, 8))
                    for q in range(4):
                        A[:, q] = latent[:, 8 * j + 2 * q]
                        A[:, q + 4] = latent[:, 8 * j + 2 * q + 1]
                    B = b_of(up, (wg * wg_cols // 8) * (up_sbo // 4) + j * 64, up_sbo, wg_cols)
                    acc += A @ B
                for cc in range(wg_cols):
                    c = wg * wg_cols + cc
                    if c >= cols:
                        continue
                    col = col0 + c
                    out[col // N, tile * 64 : t_hi, col % N] = acc[: t_hi - tile * 64, cc]
    return out


# The founding widths at the probe's three column widths, then the library kernel's edges.
for (T, D, R, N, wg_cols) in [(64, 256, 48, 128, 128), (64, 256, 48, 128, 64), (100, 256, 48, 128, 32),
                              (100, 252, 44, 132, 128), (70, 16, 8, 60, 32), (1, 64, 48, 60, 128)]:
    h = rng.standard_normal((T, D))
    wd = rng.standard_normal((D, R))
    wk, wv = rng.standard_normal((R, N)), rng.standard_normal((R, N))
    o = run_general(h, wd, wk, wv, wg_cols)
    lat = h @ wd
    ref = np.stack([lat @ wk, lat @ wv])
    print((T, D, R, N, wg_cols), "max err", np.nanmax(np.abs(o - ref)), "nan", int(np.isnan(o).sum()))
