"""Rotary embeddings as FlashAttention's apply_rotary_emb computes them, for the GPU tests'
references (imported by them once PyTorch is known to be there)."""
import torch


def apply_rotary(x, cos, sin, pos, interleaved):
    """x [..., S, H, D] with its first 2 x cos.shape[1] dims rotated at positions pos [..., S] (int64),
    in fp32 and rounded to x's dtype: GPT-J pairs (2i, 2i + 1) when interleaved, else GPT-NeoX halves."""
    rd = 2 * cos.shape[1]
    c, s = cos[pos].float().unsqueeze(-2), sin[pos].float().unsqueeze(-2)
    xr, rest = x[..., :rd].float(), x[..., rd:]
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)
    else:
        x0, x1 = xr[..., :rd // 2], xr[..., rd // 2:]
        out = torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)
    return torch.cat([out.to(x.dtype), rest], dim=-1)


def rotary_tables(rows, rd, dtype):
    """cos, sin [rows, rd / 2] in dtype for positions 0 .. rows - 1 at base 10000 (the usual RoPE)."""
    pos = torch.arange(rows, device="cuda", dtype=torch.float32)
    inv = 10000.0 ** (-torch.arange(0, rd, 2, device="cuda", dtype=torch.float32) / rd)
    return torch.cos(pos[:, None] * inv).to(dtype), torch.sin(pos[:, None] * inv).to(dtype)
