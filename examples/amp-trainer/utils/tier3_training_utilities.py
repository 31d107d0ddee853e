"""Tier 3 training utilities: fine-tune a small language model with optional AMP.

`test_fine_tuning` is the training entrypoint. It trains a tiny causal transformer on
synthetic token sequences (arithmetic progressions modulo the vocabulary, so the loss has
something to learn), validates after every epoch, measures inference latency and returns
the run's metrics.

Mixed precision follows the usual recipe: forward and loss under `torch.amp.autocast`
(float16 on CUDA, bfloat16 on CPU), the loss scaled by a GradScaler (active on CUDA only),
gradients unscaled before clipping, the optimizer step skipped on non-finite gradients.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from utils.training.metrics_tracker import MetricsTracker


class TinyTransformerLM(nn.Module):
    """Token and position embeddings, one causal transformer layer, a linear head."""

    def __init__(self, vocab_size: int, d_model: int, seq_len: int, n_heads: int = 2) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(seq_len, d_model)
        self.block = nn.TransformerEncoderLayer(
            d_model, n_heads, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)
        mask = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        hidden = self.token_embedding(tokens) + self.position_embedding(positions)
        hidden = self.block(hidden, src_mask=self.causal_mask[:length, :length], is_causal=True)
        return self.head(self.norm(hidden))


def make_synthetic_sequences(n: int, seq_len: int, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    """`n` sequences of `seq_len + 1` tokens: start + step * i (mod vocab), step in 1..4."""
    starts = torch.randint(0, vocab_size, (n, 1), generator=generator)
    steps = torch.randint(1, 5, (n, 1), generator=generator)
    offsets = torch.arange(seq_len + 1).unsqueeze(0)
    return (starts + steps * offsets) % vocab_size


def _autocast_dtype(device: torch.device) -> torch.dtype:
    return torch.float16 if device.type == "cuda" else torch.bfloat16


def _lm_loss(model: nn.Module, batch: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token cross entropy; returns the loss and the logits."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1))
    return loss, logits


def _setup_training_environment(
    model: nn.Module,
    n_samples: int,
    seq_len: int,
    vocab_size: int,
    batch_size: int,
    learning_rate: float,
    n_epochs: int,
    use_amp: bool,
    use_gpu: bool,
    seed: int | None,
) -> dict[str, Any]:
    """Device, data loaders, optimizer, scheduler, GradScaler and metrics tracker; moves `model`."""
    device = torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")
    generator = torch.Generator().manual_seed(seed if seed is not None else torch.initial_seed())
    n_val = max(batch_size, n_samples // 4)
    train_data = make_synthetic_sequences(n_samples, seq_len, vocab_size, generator)
    val_data = make_synthetic_sequences(n_val, seq_len, vocab_size, generator)

    train_dataset = TensorDataset(train_data)
    val_dataset = TensorDataset(val_data)
    train_loader = DataLoader(
        train_dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=2,
        pin_memory=torch.cuda.is_available(),
        prefetch_factor=2,
        persistent_workers=True,
    )
    val_loader = DataLoader(
        val_dataset,
        batch_size=batch_size,
        shuffle=False,
        num_workers=2,
        pin_memory=torch.cuda.is_available(),
        prefetch_factor=2,
        persistent_workers=True,
    )

    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, n_epochs))
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and device.type == "cuda")
    metrics_tracker = MetricsTracker(use_wandb=False)

    env = {
        "device": device,
        "vocab_size": vocab_size,
        "scaler": scaler,
        "use_amp": use_amp,
        "train_loader": train_loader,
        "val_loader": val_loader,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "metrics_tracker": metrics_tracker,
    }
    return env


def _run_training_epoch(
    model: nn.Module,
    train_loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    device: torch.device,
    vocab_size: int,
    use_amp: bool,
    metrics_tracker: MetricsTracker,
    max_grad_norm: float = 1.0,
) -> dict[str, Any]:
    """One pass over the training data; returns per-step losses and gradient norms."""
    model.train()
    step_losses: list[torch.Tensor] = []
    step_grad_norms: list[torch.Tensor] = []
    for batch_tuple in train_loader:
        batch = batch_tuple[0].to(device, non_blocking=True)
        with torch.amp.autocast(device.type, dtype=_autocast_dtype(device), enabled=use_amp):
            loss, _ = _lm_loss(model, batch, vocab_size)

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        if torch.isfinite(grad_norm):
            scaler.step(optimizer)
        else:
            metrics_tracker.log_scalar("train/gradient_overflow", 1.0)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

        step_losses.append(loss.detach().float())
        step_grad_norms.append(grad_norm.detach().float())

    # One transfer per epoch instead of one per step.
    losses = torch.stack(step_losses).tolist()
    grad_norms = torch.stack(step_grad_norms).tolist()
    return {
        "loss": sum(losses) / len(losses),
        "grad_norm": sum(grad_norms) / len(grad_norms),
        "loss_history": losses,
        "grad_norm_history": grad_norms,
    }


def _run_validation(
    model: nn.Module, val_loader: DataLoader, device: torch.device, vocab_size: int, use_amp: bool
) -> dict[str, float]:
    """Mean validation loss and next-token accuracy (accuracy computed in float32)."""
    model.eval()
    total_loss = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    n_batches = 0
    n_tokens = 0
    with torch.no_grad():
        for batch_tuple in val_loader:
            batch = batch_tuple[0].to(device, non_blocking=True)
            with torch.amp.autocast(device.type, dtype=_autocast_dtype(device), enabled=use_amp):
                loss, logits = _lm_loss(model, batch, vocab_size)
            total_loss += loss.float()
            correct += (logits.float().argmax(dim=-1) == batch[:, 1:]).sum()
            n_batches += 1
            n_tokens += batch[:, 1:].numel()
    return {"loss": total_loss.item() / max(1, n_batches), "accuracy": correct.item() / max(1, n_tokens)}


def _measure_inference_latency(
    model: nn.Module, samples: torch.Tensor, device: torch.device, use_amp: bool
) -> list[float]:
    """Forward latency of each sample in seconds.

    On CUDA each forward is bracketed by events and the host waits once, at the end; on
    the CPU the wall clock is exact already.
    """
    model.eval()
    samples = samples.to(device)
    dtype = _autocast_dtype(device)
    with torch.no_grad():
        if device.type == "cuda":
            events = []
            for sample in samples:
                start_event = torch.cuda.Event(enable_timing=True)
                end_event = torch.cuda.Event(enable_timing=True)
                start_event.record()
                with torch.amp.autocast(device.type, dtype=dtype, enabled=use_amp):
                    model(sample[:-1].unsqueeze(0))
                end_event.record()
                events.append((start_event, end_event))
            torch.cuda.synchronize()
            return [start.elapsed_time(end) / 1000.0 for start, end in events]

        times = []
        for sample in samples:
            started = time.perf_counter()
            with torch.amp.autocast(device.type, dtype=dtype, enabled=use_amp):
                model(sample[:-1].unsqueeze(0))
            times.append(time.perf_counter() - started)
        return times


def test_fine_tuning(
    n_epochs: int = 3,
    batch_size: int = 4,
    learning_rate: float = 3e-3,
    n_samples: int = 50,
    seq_len: int = 32,
    vocab_size: int = 64,
    d_model: int = 64,
    use_amp: bool = False,
    use_gpu: bool = True,
    seed: int | None = 42,
    n_latency_samples: int = 8,
) -> dict[str, Any]:
    """Fine-tune the tiny LM and return its metrics (losses, accuracy, timings, memory)."""
    if seed is not None:
        torch.manual_seed(seed)
    print("=" * 60)
    print(f"Fine-tuning test (AMP: {'on' if use_amp else 'off'})")
    print("=" * 60)

    model = TinyTransformerLM(vocab_size, d_model, seq_len)
    env = _setup_training_environment(
        model,
        n_samples=n_samples,
        seq_len=seq_len,
        vocab_size=vocab_size,
        batch_size=batch_size,
        learning_rate=learning_rate,
        n_epochs=n_epochs,
        use_amp=use_amp,
        use_gpu=use_gpu,
        seed=seed,
    )
    device = env["device"]
    metrics_tracker = env["metrics_tracker"]
    print(f"Device: {device}")
    print(f"Training samples: {len(env['train_data'])}")
    print(f"Validation samples: {len(env['val_data'])}")

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    loss_history: list[float] = []
    grad_norm_history: list[float] = []
    val_loss_history: list[float] = []
    val_metrics: dict[str, float] = {"loss": math.nan, "accuracy": 0.0}
    training_started = time.perf_counter()
    for epoch in range(n_epochs):
        epoch_started = time.perf_counter()
        train_metrics = _run_training_epoch(
            model,
            env["train_loader"],
            env["optimizer"],
            env["scaler"],
            device,
            env["vocab_size"],
            env["use_amp"],
            metrics_tracker,
        )
        val_metrics = _run_validation(model, env["val_loader"], device, env["vocab_size"], env["use_amp"])
        learning_rate_now = env["scheduler"].get_last_lr()[0]
        env["scheduler"].step()
        metrics_tracker.log_epoch(
            epoch, train_metrics, val_metrics, learning_rate_now, time.perf_counter() - epoch_started
        )
        loss_history.extend(train_metrics["loss_history"])
        grad_norm_history.extend(train_metrics["grad_norm_history"])
        val_loss_history.append(val_metrics["loss"])
        print(
            f"Epoch {epoch + 1}/{n_epochs}: train loss {train_metrics['loss']:.4f}, "
            f"val loss {val_metrics['loss']:.4f}, val acc {val_metrics['accuracy']:.3f}"
        )
    training_time = time.perf_counter() - training_started

    val_samples = env["val_loader"].dataset.tensors[0][:n_latency_samples]
    latencies = _measure_inference_latency(model, val_samples, device, env["use_amp"])
    peak_memory_mb = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None

    n_steps = len(loss_history)
    return {
        "final_loss": loss_history[-1] if loss_history else math.nan,
        "final_val_loss": val_metrics["loss"],
        "val_accuracy": val_metrics["accuracy"],
        "loss_history": loss_history,
        "grad_norm_history": grad_norm_history,
        "val_loss_history": val_loss_history,
        "n_steps": n_steps,
        "gradient_overflows": metrics_tracker.scalar_total("train/gradient_overflow"),
        "training_time_s": training_time,
        "samples_per_second": n_steps * batch_size / training_time if training_time > 0 else math.nan,
        "inference_latency_ms": 1000.0 * sum(latencies) / len(latencies) if latencies else math.nan,
        "peak_memory_mb": peak_memory_mb,
        "device": str(device),
        "use_amp": use_amp,
        "amp_dtype": str(_autocast_dtype(device)).removeprefix("torch.") if use_amp else "float32",
        "metrics_history": metrics_tracker.metrics_history,
    }
