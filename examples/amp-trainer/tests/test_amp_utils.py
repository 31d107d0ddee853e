"""Tests of the AMP helpers: precision selection, the loss-scale callback, autocast paths."""

from __future__ import annotations

import itertools
import math
from unittest.mock import MagicMock

import pytest
import torch

from utils.tier3_training_utilities import TinyTransformerLM, _run_training_epoch, _setup_training_environment
from utils.training.amp_utils import AmpWandbCallback, compute_effective_precision


def make_trainer(scale: float | None) -> MagicMock:
    """A stand-in for a Lightning trainer whose precision plugin holds a GradScaler."""
    trainer = MagicMock()
    trainer.global_step = 7
    if scale is None:
        trainer.strategy.precision_plugin.scaler = None
    else:
        trainer.strategy.precision_plugin.scaler.get_scale.return_value = scale
    return trainer


class TestComputeEffectivePrecision:
    def test_use_amp_none_returns_requested(self):
        assert compute_effective_precision("bf16", None, True, True) == "bf16"
        assert compute_effective_precision("32", None, False, False) == "32"

    def test_use_amp_true_cuda_available_use_gpu_true(self):
        assert compute_effective_precision("32", True, True, True) == "16"

    def test_use_amp_true_cuda_available_but_use_gpu_false(self):
        assert compute_effective_precision("16", True, True, False) == "32"

    def test_use_amp_true_cuda_not_available(self):
        assert compute_effective_precision("16", True, False, True) == "32"

    def test_use_amp_false_always_returns_32(self):
        for cuda_available, use_gpu in itertools.product([True, False], repeat=2):
            assert compute_effective_precision("16", False, cuda_available, use_gpu) == "32"

    def test_all_combinations(self):
        for requested, use_amp, cuda_available, use_gpu in itertools.product(
            ["16", "32"], [True, False], [True, False], [True, False]
        ):
            expected = "16" if (use_amp and cuda_available and use_gpu) else "32"
            assert compute_effective_precision(requested, use_amp, cuda_available, use_gpu) == expected


class TestAmpWandbCallback:
    def test_precision_variant_16(self):
        callback = AmpWandbCallback(enabled=True, precision="16")
        assert callback.autocast_dtype == "float16" and callback.amp_active

    def test_precision_variant_16_mixed(self):
        callback = AmpWandbCallback(enabled=True, precision="16-mixed")
        assert callback.autocast_dtype == "float16" and callback.amp_active

    def test_precision_variant_16_true(self):
        callback = AmpWandbCallback(enabled=True, precision="16-true")
        assert callback.autocast_dtype == "float16" and callback.amp_active

    def test_precision_variant_bf16(self):
        callback = AmpWandbCallback(enabled=True, precision="bf16")
        assert callback.autocast_dtype == "bfloat16" and callback.amp_active

    def test_enabled_false(self):
        run = MagicMock()
        callback = AmpWandbCallback(enabled=False, precision="16-mixed", run=run)
        assert not callback.amp_active
        assert callback.on_train_epoch_end(make_trainer(1024.0)) is None
        run.log.assert_not_called()

    def test_get_loss_scale_with_valid_scaler(self):
        assert AmpWandbCallback.get_loss_scale(make_trainer(65536.0)) == 65536.0

    def test_get_loss_scale_with_no_scaler(self):
        assert AmpWandbCallback.get_loss_scale(make_trainer(None)) is None

    def test_get_loss_scale_extreme_values(self):
        assert AmpWandbCallback.get_loss_scale(make_trainer(0.0)) == 0.0
        assert AmpWandbCallback.get_loss_scale(make_trainer(2.0**-24)) == 2.0**-24
        assert math.isinf(AmpWandbCallback.get_loss_scale(make_trainer(float("inf"))))
        run = MagicMock()
        record = AmpWandbCallback(precision="16-mixed", run=run).on_train_epoch_end(make_trainer(float("inf")))
        assert record["amp/loss_scale_log2"] is None
        run.log.assert_called_once()

    def test_on_train_epoch_end_no_wandb_run(self):
        callback = AmpWandbCallback(enabled=True, precision="16-mixed", run=None)
        assert callback.on_train_epoch_end(make_trainer(1024.0)) is None


class TestAMPIntegration:
    def test_amp_cpu_fallback(self):
        assert compute_effective_precision("16", True, cuda_available=False, use_gpu=True) == "32"
        model = TinyTransformerLM(vocab_size=16, d_model=16, seq_len=8)
        tokens = torch.randint(0, 16, (2, 8))
        with torch.cuda.amp.autocast():
            logits = model(tokens)
        assert logits.dtype == torch.float32
        assert logits.shape == (2, 8, 16)

    def test_model_forward_with_autocast(self):
        if not torch.cuda.is_available():
            pytest.skip("CUDA not available")
        model = TinyTransformerLM(vocab_size=16, d_model=16, seq_len=8).cuda()
        tokens = torch.randint(0, 16, (2, 8), device="cuda")
        with torch.amp.autocast("cuda", dtype=torch.float16):
            logits = model(tokens)
        assert logits.dtype == torch.float16
        assert torch.isfinite(logits).all()

    def test_grad_scaler_basic_workflow(self):
        if not torch.cuda.is_available():
            pytest.skip("CUDA not available")
        model = torch.nn.Linear(8, 1).cuda()
        before = model.weight.detach().clone()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        for _ in range(3):
            x = torch.randn(16, 8, device="cuda")
            with torch.amp.autocast("cuda", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        assert 0 < scaler.get_scale() < math.inf
        assert not torch.equal(before, model.weight.detach())

    def test_end_to_end_training_with_amp(self):
        if not torch.cuda.is_available():
            pytest.skip("CUDA not available")
        model = TinyTransformerLM(vocab_size=16, d_model=16, seq_len=8)
        env = _setup_training_environment(
            model, n_samples=16, seq_len=8, vocab_size=16, batch_size=4, learning_rate=1e-3,
            n_epochs=1, use_amp=True, use_gpu=True, seed=0,
        )
        metrics = _run_training_epoch(
            model, env["train_loader"], env["optimizer"], env["scaler"], env["device"],
            env["vocab_size"], env["use_amp"], env["metrics_tracker"],
        )
        assert len(metrics["loss_history"]) == 4
        assert all(math.isfinite(value) for value in metrics["loss_history"])
        assert env["scaler"].is_enabled() and env["scaler"].get_scale() > 0
