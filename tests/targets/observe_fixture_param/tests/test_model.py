import pytest
import torch


class TestTrained:
    @pytest.mark.parametrize("trained", [0.001, 0.1], indirect=True)
    def test_predicts_a_finite_value(self, trained: torch.nn.Module) -> None:
        assert torch.isfinite(trained(torch.zeros(1, 4))).all()
