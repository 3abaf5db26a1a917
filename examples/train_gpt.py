"""Train a small character-level GPT on Shakespeare, with flashtile attention or a baseline.

    python examples/train_gpt.py                          # CPU defaults: 1-2 minutes on 2 cores
    python examples/train_gpt.py --attn sdpa              # the same model and batches on torch's SDPA
    python examples/train_gpt.py --device cuda --dtype bfloat16 --context 1024 --n-layer 6 \\
        --n-embd 384 --n-head 6 --batch-size 32 --steps 300 --lr 2e-3
    python examples/compare_runs.py runs/flashtile runs/sdpa runs/naive   # overlay the loss curves

A run that runs out of GPU memory (``--attn naive`` at long contexts) stops cleanly:
``log.json`` says ``"status": "out_of_memory"`` and the exit code is 3.

``--attn`` picks the attention inside the same model, so that a seed gives the same
weights and batches on every path:

- ``flashtile``: :class:`flashtile.nn.Attention`, i.e. ``flashtile.attention`` on
  (batch, seqlen, heads, headdim) views of the qkv projection;
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``;
- ``naive``: ``flashtile.naive_attention(upcast=False)``, standard attention that
  materialises the (seqlen × seqlen) scores and probabilities.

It writes ``log.json`` (configuration, losses, tokens/s, peak memory, a sample) and
``loss.png`` (needs matplotlib) into ``--out``. Peak memory is measured around one
training step's forward and backward with :func:`flashtile.memory.track_peak_memory`:
the bytes allocated inside that step (activations, saved tensors, gradients).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import flashtile
from flashtile.memory import track_peak_memory
from flashtile.nn import Attention

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "shakespeare.txt"
EXIT_OUT_OF_MEMORY = 3


# -- attention: one set of weights and projections, three implementations


class SDPAAttention(Attention):
    """The same layer, attention computed by torch's scaled_dot_product_attention."""

    def attend(self, q, k, v):
        if self.window_size != (-1, -1) or self.softcap > 0:
            raise ValueError("--attn sdpa: torch's SDPA has no sliding window or softcap")
        group = self.num_heads // self.num_kv_heads
        if group > 1:  # repeat K/V heads explicitly: enable_gqa needs torch >= 2.5
            k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=self.causal, scale=self.softmax_scale)  # (B, H, S, D)
        return out.transpose(1, 2)                                                          # (B, S, H, D)


class NaiveAttention(Attention):
    """The same layer, attention computed by standard attention in the input dtype."""

    def attend(self, q, k, v):
        return flashtile.naive_attention(q, k, v, causal=self.causal, window_size=self.window_size,
                                         softmax_scale=self.softmax_scale, softcap=self.softcap, upcast=False)


ATTENTION = {"flashtile": Attention, "sdpa": SDPAAttention, "naive": NaiveAttention}


# -- the model


@dataclass
class GPTConfig:
    vocab_size: int
    context: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    attn: str = "flashtile"


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.n_embd)
        self.attn = ATTENTION[cfg.attn](cfg.n_embd, cfg.n_head, num_kv_heads=cfg.n_kv_head, causal=True,
                                        max_seqlen=cfg.context)
        self.norm2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):                      # (B, T, C)
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Token embedding (no position embedding: rotary inside attention), blocks, tied output head."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight
        self.apply(self._init)
        for block in self.blocks:  # GPT-2: residual projections scaled down by depth
            nn.init.normal_(block.attn.out_proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))
            nn.init.normal_(block.mlp[2].weight, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx):                    # idx (B, T) int64
        x = self.embed(idx)                    # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))         # (B, T, vocab)


# -- data


class CharData:
    """The text as int64 character ids, split 90% train / 10% validation."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        ids = torch.tensor([self.index[c] for c in text], dtype=torch.int64)
        split = int(0.9 * len(ids))
        self.train, self.val = ids[:split], ids[split:]

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)

    @staticmethod
    def batch(ids: torch.Tensor, batch_size: int, context: int, generator: torch.Generator, device):
        """Random windows: x (B, T) and the next characters y (B, T)."""
        starts = torch.randint(len(ids) - context - 1, (batch_size,), generator=generator)
        x = torch.stack([ids[s:s + context] for s in starts])
        y = torch.stack([ids[s + 1:s + context + 1] for s in starts])
        return x.to(device), y.to(device)


# -- training


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", choices=sorted(ATTENTION), default="flashtile", help="attention implementation")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="autocast dtype for matmuls and attention (parameters stay float32)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a UTF-8 text file")
    p.add_argument("--context", type=int, default=128, help="sequence length T")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW, warmup then cosine)")
    p.add_argument("--n-layer", type=int, default=3)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-kv-head", type=int, default=None, help="key/value heads (GQA); default n-head")
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--eval-interval", type=int, default=100, help="steps between validation losses")
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--sample-chars", type=int, default=200, help="characters to generate at the end (0: none)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU intra-op threads (default 1: on a busy 2-core machine two threads stalled each "
                        "other, 1k against 6k tokens/s; raise it on an idle many-core machine)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/<attn>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = Path("runs") / args.attn
    if args.n_kv_head is None:
        args.n_kv_head = args.n_head
    for name in ("threads", "context", "batch_size", "steps", "n_layer", "n_head", "n_kv_head", "n_embd",
                 "eval_interval", "eval_batches"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')}: expected a positive number, got {getattr(args, name)}")
    return args


def learning_rate(step: int, steps: int, peak: float) -> float:
    """Linear warmup over the first 10% of steps, then cosine decay to peak / 10."""
    warmup = max(1, steps // 10)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model, data: CharData, args, autocast) -> float:
    generator = torch.Generator().manual_seed(args.seed + 1)  # the same validation windows every time
    losses = []
    for _ in range(args.eval_batches):
        x, y = data.batch(data.val, args.batch_size, args.context, generator, args.device)
        with autocast():
            logits = model(x)
        losses.append(F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).item())
    return sum(losses) / len(losses)


@torch.no_grad()
def sample(model, data: CharData, args, autocast, prompt: str = "\n") -> str:
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    ids = torch.tensor([[data.index[c] for c in prompt]], device=args.device)
    for _ in range(args.sample_chars):
        with autocast():
            logits = model(ids[:, -args.context:])[:, -1].float()            # (1, vocab)
        next_id = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        ids = torch.cat((ids, next_id), dim=1)
    return data.decode(ids[0, len(prompt):].tolist())


def plot_losses(runs: dict, path: Path) -> str | None:
    """Train (lines) and validation (dots) loss of each run's log; returns an error message or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "loss.png not written: matplotlib is not installed (pip install matplotlib, or flashtile[bench])"
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, log in runs.items():
        line, = ax.plot([s["step"] for s in log["steps"]], [s["loss"] for s in log["steps"]], lw=1, alpha=0.8,
                        label=f"{label} train")
        if log["eval"]:
            ax.plot([e["step"] for e in log["eval"]], [e["val_loss"] for e in log["eval"]], "o", color=line.get_color(),
                    label=f"{label} validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per character)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    first = next(iter(runs.values()))["config"]
    ax.set_title(f"char-level GPT, context {first['context']}, {first['n_layer']} layers × {first['n_embd']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def train(args: argparse.Namespace) -> dict:
    """Train, write log.json and loss.png into args.out, and return the log."""
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = CharData(args.data.read_text(encoding="utf-8"))
    cfg = GPTConfig(len(data.chars), args.context, args.n_layer, args.n_head, args.n_kv_head, args.n_embd, args.attn)
    model = GPT(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    dtype = getattr(torch, args.dtype)

    def autocast():
        return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    generator = torch.Generator().manual_seed(args.seed)
    tokens_per_step = args.batch_size * args.context
    # Step 0 warms up (Triton compiles its kernels there) and the peak-memory step runs under
    # a dispatch mode on the CPU: neither counts towards tokens/s.
    memory_step = 1 if args.steps > 1 else 0
    log = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()} | asdict(cfg),
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "flashtile": flashtile.__version__,
        "steps": [], "eval": [], "status": "running",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    timed_seconds, timed_steps, start = 0.0, 0, time.perf_counter()

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(TextColumn(f"[bold]{args.attn}[/]"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[status]}"), TimeRemainingColumn(), disable=args.quiet)
    try:
        with progress:
            task = progress.add_task("train", total=args.steps, status="")
            for step in range(args.steps):
                lr = learning_rate(step, args.steps, args.lr)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                x, y = data.batch(data.train, args.batch_size, args.context, generator, device)
                t0 = time.perf_counter()
                if step == memory_step:
                    with track_peak_memory(device) as peak:
                        with autocast():
                            loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
                        loss.backward()
                    log["peak_memory_bytes"] = peak.peak_bytes
                else:
                    with autocast():
                        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
                    loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                loss_value = loss.item()  # waits for the GPU: the step's time is complete
                if step not in (0, memory_step):
                    timed_seconds += time.perf_counter() - t0
                    timed_steps += 1
                log["steps"].append({"step": step, "loss": loss_value, "lr": lr})
                if (step + 1) % args.eval_interval == 0 or step + 1 == args.steps:
                    log["eval"].append({"step": step + 1, "val_loss": evaluate(model, data, args, autocast)})
                rate = timed_steps * tokens_per_step / timed_seconds if timed_steps else float("nan")
                progress.update(task, advance=1, status=f"loss {loss_value:.3f}  {rate:,.0f} tok/s")
    except torch.cuda.OutOfMemoryError as exc:
        log["status"], log["error"] = "out_of_memory", str(exc).splitlines()[0]
        (args.out / "log.json").write_text(json.dumps(log, indent=1))
        return log

    log["status"] = "ok"
    log["initial_loss"] = log["steps"][0]["loss"]
    log["final_loss"] = sum(s["loss"] for s in log["steps"][-10:]) / min(10, len(log["steps"]))
    log["tokens_per_s"] = timed_steps * tokens_per_step / timed_seconds if timed_steps else None
    log["train_seconds"] = time.perf_counter() - start
    log["sample"] = sample(model, data, args, autocast) if args.sample_chars > 0 else ""
    plot_error = plot_losses({args.attn: log}, args.out / "loss.png")
    log["plot"] = None if plot_error else "loss.png"
    if plot_error:
        log["plot_error"] = plot_error
    (args.out / "log.json").write_text(json.dumps(log, indent=1))
    return log


def report(log: dict, out: Path) -> None:
    from rich.console import Console

    console = Console()
    if log["status"] != "ok":
        console.print(f"[red]{log['config']['attn']}: {log['status']}[/]: {log.get('error', '')}")
        return
    evals = ", ".join(f"{e['step']}: {e['val_loss']:.3f}" for e in log["eval"])
    console.print(f"loss {log['initial_loss']:.3f} -> {log['final_loss']:.3f} (mean of the last 10 steps); "
                  f"validation {evals}")
    rate = log["tokens_per_s"]
    console.print(f"{rate:,.0f} tokens/s" if rate else "tokens/s: needs --steps ≥ 3",
                  f"peak memory of one step: {log['peak_memory_bytes'] / 2**20:.1f} MiB",
                  f"on {log['device']}, {log['parameters']:,} parameters", sep=" · ")
    if log["sample"]:
        console.print("sample:", markup=False)
        console.print(log["sample"], markup=False, highlight=False)
    if log.get("plot_error"):
        console.print(f"[yellow]{log['plot_error']}[/]")
    console.print(f"wrote {out / 'log.json'}" + (f" and {out / 'loss.png'}" if log["plot"] else ""))


def main(argv=None) -> int:
    args = parse_args(argv)
    log = train(args)
    if not args.quiet:
        report(log, args.out)
    return 0 if log["status"] == "ok" else EXIT_OUT_OF_MEMORY


if __name__ == "__main__":
    sys.exit(main())
