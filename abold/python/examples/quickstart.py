"""The README's example, runnable: flash_attn_func on PyTorch tensors, checked against PyTorch."""
import torch

import flashattn

q = torch.randn(2, 1024, 16, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(2, 1024, 4, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
out = flashattn.flash_attn_func(q, k, v, causal=True)  # FlashAttention-2's signature and semantics

ref = torch.nn.functional.scaled_dot_product_attention(
    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True).transpose(1, 2)
print(f"out {tuple(out.shape)} {out.dtype}; max |out - torch sdpa| = {(out.float() - ref.float()).abs().max().item():.3e}")
