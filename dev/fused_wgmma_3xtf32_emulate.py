# Emulates the probe's index algebra (not the hardware): shared-memory images as the kernel writes
# them, wgmma's operand model (B(n, kappa) at start + (n/8) SBO + (kappa/4) LBO + (n%8) 16 +
# (kappa%4) 4; A fragments a0..a3 = (g, q), (g+8, q), (g, q+4), (g+8, q+4); accumulators
# d[4j..4j+3] = (g, 8j+2q), (g, 8j+2q+1), (g+8, 8j+2q), (g+8, 8j+2q+1)), one 64-token tile.
import numpy as np
D, R, N = 256, 48, 128
C = 2 * N
rng = np.random.default_rng(1)
T = 64
hidden = rng.standard_normal((T, D))
w_down = rng.standard_normal((D, R))
w_up_k = rng.standard_normal((R, N)); w_up_v = rng.standard_normal((R, N))
down_sbo, up_sbo = (D // 4) * 128, (R // 4) * 128

def run(down_wgs, wg_cols):
    block_cols = 2 * wg_cols
    out = np.full((2, T, N), np.nan)
    for col0 in range(0, C, block_cols):
        down = np.zeros(R * D)  # as 4-byte words
        for i in range(R * (D // 4)):
            n, kq = i % R, i // R
            p = 16 * (kq // 4) + kq % 4
            at = (n // 8) * (down_sbo // 4) + kq * 32 + (n % 8) * 4
            for e in range(4): down[at + e] = w_down[p + 4 * e, n]
        up = np.zeros(block_cols * R)
        for i in range(block_cols * (R // 4)):
            n, kq = i % block_cols, i // block_cols
            j, h = kq // 2, kq % 2
            c = col0 + n
            for e in range(4):
                r = 8 * j + 2 * e + h
                up[(n // 8) * (up_sbo // 4) + kq * 32 + (n % 8) * 4 + e] = w_up_k[r, c] if c < N else w_up_v[r, c - N]
        def b_of(mem, start_words, sbo, ncols):
            B = np.zeros((8, ncols))
            for n in range(ncols):
                for k in range(8):
                    B[k, n] = mem[start_words + (n // 8) * (sbo // 4) + (k // 4) * 32 + (n % 8) * 4 + k % 4]
            return B
        latent = np.zeros((64, R))
        for wg in range(down_wgs):
            dc = R // down_wgs
            acc = np.zeros((64, dc))
            for u in range(D // 16):
                for e in range(2):
                    A = np.zeros((64, 8))
                    for m in range(64):
                        for q in range(4):
                            # the lane's float4 at columns 16u + 4q: (x, y) for e = 0, (z, w) for e = 1
                            A[m, q] = hidden[m, 16 * u + 4 * q + 2 * e]
                            A[m, q + 4] = hidden[m, 16 * u + 4 * q + 2 * e + 1]
                    s = 2 * u + e
                    B = b_of(down, (wg * dc // 8) * (down_sbo // 4) + s * 64, down_sbo, dc)
                    acc += A @ B
            latent[:, wg * dc:(wg + 1) * dc] = acc
        for wg in range(2):
            acc = np.zeros((64, wg_cols))
            for j in range(R // 8):
                A = np.zeros((64, 8))
                for m in range(64):
                    for q in range(4):
                        A[m, q] = latent[m, 8 * j + 2 * q]
                        A[m, q + 4] = latent[m, 8 * j + 2 * q + 1]
                B = b_of(up, (wg * wg_cols // 8) * (up_sbo // 4) + j * 64, up_sbo, wg_cols)
                acc += A @ B
            for cc in range(wg_cols):
                c = col0 + wg * wg_cols + cc
                out[c // N, :, c % N] = acc[:, cc]
    return out

lat = hidden @ w_down
ref = np.stack([lat @ w_up_k, lat @ w_up_v])
for v in [(2, 128), (1, 128), (2, 64), (2, 32)]:
    o = run(*v)
    print(v, "max err", np.nanmax(np.abs(o - ref)), "nan", np.isnan(o).sum())
