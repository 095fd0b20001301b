"""Checks dev/fused_tc_two_blocks_swizzled.patch's shared-memory layout on the CPU (no GPU needed).

w_down is staged [down_rows][rank_cols] without padding, each row's 16-byte groups permuted by
group ^ swizzle(row). For every rank_cols the kernel takes (16, 32, 48, 64): the permutation stays
inside the row (a bijection of its columns), every A fragment read of the down product (lane
(g, q) at row 16 w + 8 s + q (+ 4), column 16 t + g (+ 8)) hits 32 distinct banks, and each warp's
down partials [8][rank_cols + 4] fit in its own 16 rows. Run: python3 dev/fused_tc_swizzle_check.py
"""


def swizzle(row, rank_cols):
    return 2 * (row % 4) if rank_cols % 32 == 0 else 2 * ((row // 2) % 2)


def index(row, col, rank_cols):
    return row * rank_cols + (((col // 4) ^ swizzle(row, rank_cols)) * 4 + col % 4)


for rank_cols in (16, 32, 48, 64):
    for row in range(16):
        cols = sorted(index(row, c, rank_cols) - row * rank_cols for c in range(rank_cols))
        assert cols == list(range(rank_cols)), (rank_cols, row)
    for w in range(16):
        for s in range(2):
            for plus4 in (0, 4):
                for t in range(rank_cols // 16):
                    for k in (0, 8):
                        banks = {index(16 * w + 8 * s + q + plus4, 16 * t + g + k, rank_cols) % 32
                                 for g in range(8) for q in range(4)}
                        assert len(banks) == 32, (rank_cols, w, s, plus4, t, k)
    assert 8 * (rank_cols + 4) <= 16 * rank_cols
print("swizzle: bijective rows, conflict-free A reads, partials fit, for rank_cols 16/32/48/64")
