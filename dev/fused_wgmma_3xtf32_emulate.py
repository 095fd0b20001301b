# Emulates the index algebra (not the hardware) of the wgmma 3xTF32 kernels: the library kernel of
# dev/fused_wgmma_configuration.patch (any D <= 256 a multiple of 4, R <= 48, N) and, at the
# founding widths, dev/fused_wgmma_3xtf32_probe.cu's (the same layouts and permutations; its
# one-warpgroup down variant reads the same layout at other offsets; run_cluster: its cluster
# variant). Shared-memory images as the
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


def down_a(rows, c, e):
    """A [64, 8] of down step e of the K pair at D column c: lane q's float4 at c + 4 q gives
    kappa = q and q + 4 its elements 2 e and 2 e + 1."""
    A = np.zeros((64, 8))
    for q in range(4):
        A[:, q] = rows[:, c + 4 * q + 2 * e]
        A[:, q + 4] = rows[:, c + 4 * q + 2 * e + 1]
    return A


def up_a(latent, j):
    """A [64, 8] of up step j: kappa = q and q + 4 are latent columns 8 j + 2 q and + 1."""
    A = np.zeros((64, 8))
    for q in range(4):
        A[:, q] = latent[:, 8 * j + 2 * q]
        A[:, q + 4] = latent[:, 8 * j + 2 * q + 1]
    return A


def stage_down(w_down, k0, depth):
    """w_down^T for D rows [k0, k0 + depth) as the kernels store it ([48][depth] core matrices;
    chunk (n, kq) holds rows k0 + 16 (kq / 4) + kq % 4 + 4 i), zeros past D and R."""
    D, R = w_down.shape
    sbo = (depth // 4) * 128
    down = np.zeros(48 * depth)
    for i in range(48 * (depth // 4)):
        n, kq = i % 48, i // 48
        k = k0 + 16 * (kq // 4) + kq % 4
        for e in range(4):
            if n < R and k + 4 * e < D:
                down[(n // 8) * (sbo // 4) + kq * 32 + (n % 8) * 4 + e] = w_down[k + 4 * e, n]
    return down


def stage_up(w_up_k, w_up_v, col0, count, cols):
    """Columns [col0, col0 + count) of [w_up_k | w_up_v] as the kernels store them ([count][48];
    chunk (n, kq = 2 j + h) holds rows 8 j + 2 i + h), zeros past R and past the block's cols."""
    R, N = w_up_k.shape
    sbo = (48 // 4) * 128
    up = np.zeros(count * 48)
    for i in range(count * 12):
        n, kq = i % count, i // count
        j, h = kq // 2, kq % 2
        col = col0 + n
        for e in range(4):
            r = 8 * j + 2 * e + h
            if n < cols and r < R:
                up[(n // 8) * (sbo // 4) + kq * 32 + (n % 8) * 4 + e] = (
                    w_up_k[r, col] if col < N else w_up_v[r, col - N])
    return up


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
            down = stage_down(w_down, 0, DM)
            up = stage_up(w_up_k, w_up_v, col0, block_cols, cols)
            rows = np.zeros((64, DM))
            t_hi = min(T, tile * 64 + 64)
            rows[: t_hi - tile * 64, :D] = hidden[tile * 64 : t_hi]

            latent = np.zeros((64, RC))
            for wg in range(2):
                dc = RC // 2
                acc = np.zeros((64, dc))
                for u in range(DM // 16):
                    for e in range(2):
                        A = down_a(rows, 16 * u, e)
                        B = b_of(down, (wg * dc // 8) * (down_sbo // 4) + (2 * u + e) * 64, down_sbo, dc)
                        acc += A @ B
                latent[:, wg * dc : (wg + 1) * dc] = acc
            for wg in range(2):
                acc = np.zeros((64, wg_cols))
                for j in range(RC // 8):
                    A = up_a(latent, j)
                    B = b_of(up, (wg * wg_cols // 8) * (up_sbo // 4) + j * 64, up_sbo, wg_cols)
                    acc += A @ B
                for cc in range(wg_cols):
                    c = wg * wg_cols + cc
                    if c >= cols:
                        continue
                    col = col0 + c
                    out[col // N, tile * 64 : t_hi, col % N] = acc[: t_hi - tile * 64, cc]
    return out



def run_cluster(hidden, w_down, w_up_k, w_up_v, blocks=4):
    """The cluster kernels (the probe's at the founding widths, 4 or 8 blocks; the library's at
    D <= 256, R <= 48, 2N <= 256, 4 blocks): block r of a tile's cluster holds w_down rows
    [r depth, (r + 1) depth) and [K | V] columns [r cols, (r + 1) cols) (those below 2N), depth =
    256 / blocks, cols = 256 / blocks; warpgroup w's partial over the block's local K pairs
    pairs w + u (pairs = depth / 32), steps 2 (pairs w + u) + e; the up product sums the
    partials (in whatever grouping: slots per warpgroup or per block)."""
    T, D = hidden.shape
    N = w_up_k.shape[1]
    depth = cols = 256 // blocks
    pairs, down_sbo, up_sbo = depth // 32, (depth // 4) * 128, (48 // 4) * 128
    out = np.full((2, T, N), np.nan)
    for tile in range((T + 63) // 64):
        t_hi = min(T, tile * 64 + 64)
        rows = np.zeros((64, 256))
        rows[: t_hi - tile * 64, :D] = hidden[tile * 64 : t_hi]
        latent = np.zeros((64, 48))
        for rank in range(blocks):
            down = stage_down(w_down, rank * depth, depth)
            for wg in range(2):
                for u in range(pairs):
                    for e in range(2):
                        A = down_a(rows, rank * depth + 16 * (pairs * wg + u), e)
                        latent += A @ b_of(down, (2 * (pairs * wg + u) + e) * 64, down_sbo, 48)
        half = cols // 2
        for rank in range(blocks):
            block_cols = max(0, min(cols, 2 * N - rank * cols))
            up = stage_up(w_up_k, w_up_v, rank * cols, cols, block_cols)
            for wg in range(2):
                acc = np.zeros((64, half))
                for j in range(6):
                    acc += up_a(latent, j) @ b_of(up, (wg * half // 8) * (up_sbo // 4) + j * 64, up_sbo, half)
                for cc in range(half):
                    if half * wg + cc >= block_cols:
                        continue
                    col = rank * cols + half * wg + cc
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

for (T, D, R, N, blocks) in [(100, 256, 48, 128, 4), (1, 252, 44, 60, 4), (65, 16, 8, 12, 4),
                             (100, 256, 48, 128, 8)]:
    h = rng.standard_normal((T, D))
    wd = rng.standard_normal((D, R))
    wk, wv = rng.standard_normal((R, N)), rng.standard_normal((R, N))
    o = run_cluster(h, wd, wk, wv, blocks)
    ref = np.stack([(h @ wd) @ wk, (h @ wd) @ wv])
    print("cluster", (T, D, R, N, blocks), "max err", np.nanmax(np.abs(o - ref)),
          "nan", int(np.isnan(o).sum()))
