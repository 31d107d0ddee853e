"""Which optimizer left parameters out (`correctness.unused`), from the modules each optimizer's
parameters belong to: among several built at different lines (a dict of optimizers in
`configure_optimizers`), the one over the left-out parameters' siblings."""

from __future__ import annotations

from types import SimpleNamespace

from traingate.stages.correctness.probe.payloads import OptimizerRecord, ParameterDescription
from traingate.stages.correctness.unused import _optimizer_site


def _optimizer(site: int, *modules: str) -> OptimizerRecord:
    return OptimizerRecord.model_validate({"class": "Adam", "groups": [{"lr": 0.001, "params": 2}], "site": site, "modules": list(modules)})


def _param(name: str, root: str = "VAEModule") -> ParameterDescription:
    return ParameterDescription.model_validate({"name": name, "root": root, "root_site": 0, "module": "Linear", "site": 3, "shape": [4, 4]})


def test_of_several_optimizers_the_one_over_the_left_out_parameters_siblings_is_named() -> None:
    encoder, critic = _optimizer(7, "VAEModule:module.vae.encoder.0", "VAEModule:module.vae.encoder.2"), _optimizer(9, "VAEModule:module.critic.0")
    steps = SimpleNamespace(optimizers=[encoder, critic])
    assert _optimizer_site(steps, [_param("module.vae.decoder.0.weight"), _param("module.vae.decoder.0.bias")]) == 7  # type: ignore[arg-type]
    # All built at one line: that line, whatever the parameters.
    assert _optimizer_site(SimpleNamespace(optimizers=[_optimizer(4), _optimizer(4)]), [_param("x.weight")]) == 4  # type: ignore[arg-type]
    # Two equally near (each over a sibling at the top), or none in the same model: none named.
    assert _optimizer_site(SimpleNamespace(optimizers=[_optimizer(7, "Net:a"), _optimizer(9, "Net:b")]), [_param("c.weight", "Net")]) is None  # type: ignore[arg-type]
    assert _optimizer_site(steps, [_param("head.weight", "Other")]) is None  # type: ignore[arg-type]
