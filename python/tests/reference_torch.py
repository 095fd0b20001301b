"""The PyTorch reference module of issue 4, as users have it: LatentKVProjection must load its
state_dict, draw the same weights from the same seed and match its forward. And the bf16 / fp16
error budget of design.md: twice the error of torch's own unfused matmuls in that dtype."""

import math

import torch
from torch import nn

from latentkv.torch import reference_kv_proj  # the package's own unfused computation
from reference import reference, rel_error


class ReferenceKVProjection(nn.Module):
    def __init__(self, model_dim, rank, num_heads, head_dim):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.w_down = nn.Parameter(torch.randn(model_dim, rank) / math.sqrt(model_dim))
        self.w_up_k = nn.Parameter(torch.randn(rank, num_heads * head_dim) / math.sqrt(rank))
        self.w_up_v = nn.Parameter(torch.randn(rank, num_heads * head_dim) / math.sqrt(rank))

    def forward(self, x):
        B, S, _ = x.shape
        latent = x @ self.w_down
        k = (latent @ self.w_up_k).view(B, S, self.num_heads, self.head_dim)
        v = (latent @ self.w_up_v).view(B, S, self.num_heads, self.head_dim)
        return torch.stack([k, v], dim=0)


def unfused_budgets(args, num_heads):
    """For bf16 / fp16 tensors (hidden, w_down, w_up_k, w_up_v): the float64 reference (out,
    latent) and the budgets a result must meet against them, 2x the relative error of torch's
    unfused computation in the same dtype (+1e-7 where that error is 0)."""
    ref_out, ref_latent = reference(*(t.float().numpy() for t in args), num_heads)
    unfused = reference_kv_proj(*args, num_heads)
    unfused_latent = args[0] @ args[1]
    out_budget = 2 * rel_error(unfused.float().numpy(), ref_out) + 1e-7
    latent_budget = 2 * rel_error(unfused_latent.float().numpy(), ref_latent) + 1e-7
    return ref_out, ref_latent, out_budget, latent_budget
