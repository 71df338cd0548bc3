"""A small GPT trained in bf16 autocast that states its own FLOPs and step
time, for the MFU check.

    cuda_gpt.py --steps 60 --skip 20

Token embedding, `--layers` pre-norm blocks (causal self-attention through
F.scaled_dot_product_attention, a 4x GELU MLP) and an LM head, AdamW. It
prints the FLOPs of one training step worked out from the shapes
(`FLOPS_PER_STEP`, forward and backward apart: `FLOPS_FORWARD`,
`FLOPS_BACKWARD`) and the mean step time between step `skip` and the last
(`STEP_MS`, synchronised once at each end), the figures a hand calculation
of MFU starts from.

The analytic count, per step (B batch, T tokens, C width, L layers, V
vocabulary; a matmul of (m x k) by (k x n) is 2*m*k*n FLOPs):

* forward: 24*B*T*C^2 per block (the Linears: C->3C, C->C, C->4C, 4C->C),
  attention 4*B*T^2*C per block times the causal share (T+1)/(2T) (the fused
  kernel skips the masked blocks), and the LM head 2*B*T*C*V;
* backward: twice each Linear (weight and input gradients: every input
  needs one, the embedding's output included), and 5 of attention's
  matmuls (the scores recomputed, then dV, dP, dQ, dK), i.e. 2.5 times its
  forward;
* nothing for embeddings, norms, GELU, softmax, the loss or AdamW.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.blocks(self.embed(tokens))))


def analytic(b: int, t: int, c: int, layers: int, vocab: int) -> tuple[int, int]:
    share = (t + 1) / (2 * t)
    linear = 24 * b * t * c * c * layers + 2 * b * t * c * vocab
    attention = round(4 * b * t * t * c * share) * layers
    return linear + attention, 2 * linear + round(2.5 * attention)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = GPT(args.vocab, args.width, args.layers, args.heads).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, args.vocab, (args.batch, args.tokens + 1), device=device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    start = None
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), y.reshape(-1))
        loss.backward()
        optimizer.step()
        if step == args.skip - 1:
            torch.cuda.synchronize()
            start = time.perf_counter()
    torch.cuda.synchronize()
    assert start is not None, "--skip must be below --steps"
    step_ms = (time.perf_counter() - start) / (args.steps - args.skip) * 1000.0
    forward, backward = analytic(args.batch, args.tokens, args.width, args.layers, args.vocab)
    print(f"FLOPS_FORWARD {forward}", flush=True)
    print(f"FLOPS_BACKWARD {backward}", flush=True)
    print(f"FLOPS_PER_STEP {forward + backward}", flush=True)
    print(f"DEVICE {torch.cuda.get_device_name()}", flush=True)
    print(f"STEP_MS {step_ms:.4f}", flush=True)


if __name__ == "__main__":
    main()
