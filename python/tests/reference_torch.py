"""The PyTorch reference module of issue 4, as users have it: LatentKVProjection must load its
state_dict, draw the same weights from the same seed and match its forward."""

import math

import torch
from torch import nn


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
