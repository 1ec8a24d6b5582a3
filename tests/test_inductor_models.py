"""Whole models through torch.compile(backend=tininductor.compile_fx): a tiny GPT forward vs eager."""
import math

import pytest
import torch
import torch.nn.functional as F

import tininductor
from tininductor.testing import DEVICE

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Attention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class GPT(torch.nn.Module):
    def __init__(self, vocab=50, d=32, heads=4, layers=2, ctx=16):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(ctx, d)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(torch.nn.ModuleDict(dict(
                ln1=torch.nn.LayerNorm(d), attn=Attention(d, heads), ln2=torch.nn.LayerNorm(d),
                fc1=torch.nn.Linear(d, 4 * d), fc2=torch.nn.Linear(4 * d, d))))
        self.ln_f = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = x + blk["attn"](blk["ln1"](x))
            x = x + blk["fc2"](F.gelu(blk["fc1"](blk["ln2"](x))))
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1)), logits


def test_tiny_gpt_forward_matches_eager():
    torch.manual_seed(0)
    model = GPT().to(DEVICE)
    idx = torch.randint(0, 50, (2, 12), device=DEVICE)
    targets = torch.randint(0, 50, (2, 12), device=DEVICE)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=tininductor.compile_fx, dynamic=False)
    with torch.no_grad():
        loss, logits = compiled(idx, targets)
        ref_loss, ref_logits = model(idx, targets)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
