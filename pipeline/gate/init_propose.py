"""`traingate init`, second part: from what the scan found, the candidates and a tiny
configuration for each.

Every candidate gets the step budget (`max_batches`, `max_steps`), so that the training's own
defaults run short; options and parameters that size the run (epochs, steps, batch size) are
shrunk where the script or function has them, and mixed precision is switched by the option
or keyword that does it. What cannot be decided here (an argument with no default, the object
a method is called on, a framework's trainer and loaders) is a `FillIn`: a commented key in
the file, saying exactly what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pathlib import Path

from traingate.pipeline.gate.init_readme import Documented, documented_commands
from traingate.pipeline.gate.init_scan import Found, Function, Kind, Option, Param, Script, is_test, scan, script_reaches

EPOCHS = frozenset({"epochs", "num_epochs", "n_epochs", "max_epochs", "epoch", "nepochs", "num_epoch", "n_epoch", "train_epochs"})
STEPS = frozenset({
    "steps", "max_steps", "num_steps", "n_steps", "train_steps", "total_steps", "iters", "iterations", "max_iters",
    "num_iters", "n_iters", "max_iter", "niter", "n_iter", "num_iterations", "num_updates", "max_updates",
})
BATCH = frozenset({"batch_size", "bs", "batch", "train_batch_size", "per_device_train_batch_size", "micro_batch_size", "batchsize"})
CUDA_SWITCHES = frozenset({"cuda", "use_cuda", "gpu", "use_gpu"})
AMP = frozenset({"amp", "use_amp", "fp16", "mixed_precision", "autocast", "use_fp16", "bf16", "use_bf16", "half"})

TINY_EPOCHS = 2
TINY_STEPS = 16
TINY_BATCH = 8
# The step budget init writes: 16 optimizer steps (the performance stage's 3 warm-up and 8
# measured steps, with room), in one epoch of 16 batches or more, then the run stops.
MAX_BATCHES = 16
MAX_STEPS = 16
# Fewer optimizer steps than this in the check run: the stages that observe steps would
# report "not measured" (performance: warmup_steps 3 + min_steps 8).
ENOUGH_STEPS = 11

KIND_ORDER: dict[Kind, int] = {"script": 0, "function": 1, "test": 2, "method": 3, "framework": 4}


@dataclass(frozen=True)
class FillIn:
    """A key init could not decide: the commented TOML line, and what to put there."""

    key: str
    line: str  # the commented line written into the file
    what: str  # one sentence for the terminal


@dataclass
class Candidate:
    kind: Kind
    path: str
    line: int
    label: str  # `python train.py`, `train:fit`
    why: str
    entrypoint: dict[str, Any] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)
    args_comments: list[str] = field(default_factory=list)  # commented lines inside `args`
    fill_in: list[FillIn] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the file's comments say about a choice
    documented: str | None = None  # the README line that documents the command (`README.md:85`)
    fits_device: bool = True  # a documented command for the device the check runs on (`--device=cpu`)
    order: int = 0  # where the README documents it, among its commands

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runnable(self) -> bool:
        """It can run as written: nothing to fill in first."""
        return not self.fill_in

    def rank(self) -> tuple[int, int, int, int, int, int, int, str]:
        named = 0 if any(word in self.label.lower() for word in ("train", "main", "fit")) else 1
        # What the README documents first, its command for this device before the others.
        documented = (0, 0 if self.fits_device else 1, self.order) if self.documented else (1, 0, 0)
        return (len(self.fill_in), KIND_ORDER[self.kind], *documented, named, self.path.count("/"), self.label)


def candidates(found: Found, device: str = "cpu") -> list[Candidate]:
    """Every training entry point found, best first; `device`: where the check runs."""
    listed: list[Candidate] = []
    scripts = {script.path: script for script in found.scripts}
    for script in found.scripts:
        reached = script_reaches(found, script)
        if reached is not None:
            listed.append(script_candidate(script, reached, device))
    for order, doc in enumerate(documented_commands(found.root)):
        documented = scripts.get(doc.script)
        reached = script_reaches(found, documented) if documented is not None else None
        if documented is not None and reached is not None:
            listed.append(documented_candidate(doc, documented, reached, device))
            listed[-1].order = order
    for function in found.training():
        if "parse_args" in function.calls:
            continue  # it reads the command line: its script is the candidate, with `args`
        if is_test(function):
            listed.append(test_candidate(function, found.conftests))
        elif function.is_method and not function.is_static:
            owner = function.qualname.rsplit(".", 1)[0]
            listed.append(method_candidate(function, found.constructors.get(f"{function.module}:{owner}")))
        else:
            listed.append(function_candidate(function))
    if not listed:
        package = "pytorch_lightning" if "pytorch_lightning" in found.imports else "lightning.pytorch"
        listed += [framework_candidate(path, cls, line, package) for path, cls, line in found.framework_modules]
    for candidate in listed:
        candidate.notes += [f"it may download data: {what}(...) at {path}:{line}" for path, line, what in found.downloads if path == candidate.path]
    return sorted(listed, key=Candidate.rank)


def _budget(candidate: Candidate) -> None:
    candidate.entrypoint["max_batches"] = MAX_BATCHES
    candidate.entrypoint["max_steps"] = MAX_STEPS


def script_candidate(script: Script, reached: str, device: str = "cpu") -> Candidate:
    candidate = Candidate(
        kind="script", path=script.path, line=script.main_line, label=f"python {script.path}",
        why=f"{'its `__main__` block' if script.has_main else 'its module-level code'} runs {reached}, which trains"
        if reached != "its module-level code" else "its module-level code trains",
    )
    args: list[str] = []
    for option in script.options:
        args += _device_option(candidate, option) if device == "cpu" else []
        args += _script_option(candidate, option)
    candidate.entrypoint["script"] = script.path
    candidate.entrypoint["args"] = args
    _budget(candidate)
    return candidate


def documented_candidate(doc: Documented, script: Script, reached: str, device: str) -> Candidate:
    """A command line a README documents, run where it runs it, after the preparation it runs
    first; its arguments as written, and the step budget. On a CPU, a command that does not say
    `cpu` gets the script's option that keeps it off a GPU, where it has one."""
    trains = "its module-level code trains" if reached == "its module-level code" else f"it runs {reached}, which trains"
    candidate = Candidate(
        kind="script", path=script.path, line=script.main_line, label=doc.command, why=f"{doc.where} documents this command, and {trains}",
        documented=doc.where, fits_device=doc.mentions_cpu() == (device == "cpu"),
    )
    args = list(doc.args)
    if device == "cpu" and not doc.mentions_cpu():
        for option in script.options:
            if not any(arg.split("=")[0] in option.flags for arg in args):
                args += _device_option(candidate, option)
    candidate.entrypoint["script"] = doc.script
    if doc.folder:
        candidate.entrypoint["workdir"] = doc.folder
        candidate.notes.append(f"it runs in {doc.folder}/, as {doc.where} runs it")
    if doc.prepare:
        candidate.entrypoint["prepare"] = list(doc.prepare)
        candidate.notes.append(f"the README prepares its data first: `python {doc.prepare[0]}` runs before the training, in every run")
    candidate.entrypoint["args"] = args
    _budget(candidate)
    return candidate


def _script_option(candidate: Candidate, option: Option) -> list[str]:
    """The arguments one option gets in the tiny run; a FillIn when it is required and unknown."""
    name = option.dest.lower()
    if option.store_true and name in AMP and not option.positional:
        candidate.entrypoint["amp_args"] = {"on": [option.flag], "off": []}
        return []
    if option.positional and option.required or option.required and not option.has_default:
        shown = option.dest if option.positional else option.flag
        candidate.args_comments.append(f'# {"" if option.positional else json_str(option.flag) + ", "}"FILL IN",   # {shown}: required, no default (line {option.line})')
        candidate.fill_in.append(FillIn("args", "", f"{shown} in `args`: the script requires it and has no default ({candidate.path}:{option.line})"))
        return []
    value = _tiny_value(name, option.default, option.has_default)
    if value is None or option.positional:
        return []
    return [option.flag, str(value)]


def _device_option(candidate: Candidate, option: Option) -> list[str]:
    """On a machine without CUDA: the option that keeps a script off a GPU it would ask for."""
    name = option.dest.lower()
    if name in CUDA_SWITCHES and option.store_false:
        chosen = [option.flag]  # on by default; the flag switches it off
    elif name == "device" and isinstance(option.default, str) and option.default.startswith("cuda"):
        chosen = [option.flag, "cpu"]
    else:
        return []
    candidate.notes.append(f"`{' '.join(chosen)}` keeps it on the CPU, where the check ran; remove it to verify on a GPU (--device cuda)")
    return chosen


def _tiny_value(name: str, default: object, has_default: bool) -> int | None:
    """The tiny value of an epochs, steps or batch-size setting; None to keep its default."""
    current = default if isinstance(default, int) and not isinstance(default, bool) else None
    for names, tiny in ((EPOCHS, TINY_EPOCHS), (STEPS, TINY_STEPS), (BATCH, TINY_BATCH)):
        if name in names:
            if has_default and current is not None and current <= tiny:
                return None
            return tiny
    return None


def function_candidate(function: Function) -> Candidate:
    module_call = f"{function.module}:{function.qualname}"
    candidate = Candidate(kind="function", path=function.path, line=function.line, label=module_call, why=_why(function))
    candidate.entrypoint["call"] = module_call
    _keywords(candidate, function.params)
    _budget(candidate)
    return candidate


def test_candidate(function: Function, conftests: set[str]) -> Candidate:
    candidate = function_candidate(function)
    candidate.kind = "test"
    candidate.why = f"a test that trains: {candidate.why}"
    folders = {p.as_posix() for p in Path(function.path).parents}
    if folders & conftests:
        candidate.notes.append("called as a function, it runs without pytest's fixtures and conftest.py")
    for fill in list(candidate.fill_in):
        if fill.key.startswith("kwargs."):  # a fixture pytest would have given
            candidate.fill_in[candidate.fill_in.index(fill)] = FillIn(fill.key, fill.line, fill.what.replace("required, no default", "a pytest fixture"))
    return candidate


def method_candidate(function: Function, constructor: list[Param] | None) -> Candidate:
    module_call = f"{function.module}:{function.qualname}"
    owner = function.qualname.rsplit(".", 1)[0]
    candidate = Candidate(kind="method", path=function.path, line=function.line, label=module_call, why=_why(function))
    candidate.entrypoint["call"] = module_call
    if constructor is not None and all(p.has_default for p in constructor):
        # Its constructor needs no argument: the class itself is the setup that builds the instance.
        candidate.entrypoint["setup"] = f"{function.module}:{owner}"
        candidate.notes.append(f"the instance is {owner}() with its defaults; a `setup` of yours can build a smaller one")
    else:
        _constructor_fill_in(candidate, function, owner, constructor)
    _keywords(candidate, function.params)
    _budget(candidate)
    return candidate


def _constructor_fill_in(candidate: Candidate, function: Function, owner: str, constructor: list[Param] | None) -> None:
    needs = ", ".join(p.name for p in constructor or [] if not p.has_default)
    candidate.fill_in.append(FillIn(
        "setup", f'# setup = "traingate_setup:build"   # FILL IN: a function (in a module of yours) returning the {owner} instance to call {function.qualname.rsplit(".", 1)[-1]} on',
        f"`setup`: a module:function of yours that returns the {owner} instance ({function.module}.{owner}) to call the method on"
        + (f"; {owner}() requires {needs}" if needs else ""),
    ))


def framework_candidate(path: str, module_class: str, line: int, package: str) -> Candidate:
    """A framework's own fit, with a setup that builds its trainer, the module and the loaders."""
    candidate = Candidate(
        kind="framework", path=path, line=line, label=f"{package}:Trainer.fit",
        why=f"{module_class} is a LightningModule, and no script or function of the repo runs a Trainer on it",
    )
    candidate.entrypoint["call"] = f"{package}:Trainer.fit"
    candidate.fill_in.append(FillIn(
        "setup", '# setup = "traingate_setup:build"   # FILL IN: returning {"self": Trainer(max_epochs=2, accelerator="cpu"), '
        f'"model": {module_class.rsplit(":", 1)[-1]}(...), "train_dataloaders": ...}}',
        f"`setup`: a module:function returning the Trainer (as 'self'), the {module_class} instance and its loaders",
    ))
    _budget(candidate)
    return candidate


def _why(function: Function) -> str:
    how = {"loop": "calls backward() and an optimizer's step()", "fit": "calls a trainer's fit()", "train": "calls a trainer's train()"}
    if function.trains:
        return f"{function.qualname} {how[function.trains]}"
    return f"{function.qualname} calls {function.reaches}, which trains"


def _keywords(candidate: Candidate, params: list[Param]) -> None:
    for param in params:
        name = param.name.lower()
        if name in AMP and (not param.has_default or isinstance(param.default, bool)):
            candidate.entrypoint["amp_flag"] = param.name
            continue
        value = _tiny_value(name, param.default, param.has_default)
        if value is not None:
            candidate.kwargs[param.name] = value
        elif not param.has_default:
            candidate.fill_in.append(FillIn(
                f"kwargs.{param.name}", f"# {param.name} = \"FILL IN\"   # required, no default: a TOML value, or build it in a `setup`",
                f"`{param.name}` (required, no default): a value in [entrypoint.kwargs], or an object a `setup` returns in its dict",
            ))


def json_str(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    import json

    return json.dumps(text, ensure_ascii=False)


def hint(root: Path) -> str | None:
    """For an unconfigured run: the candidate `traingate init` would pick, from reading the files
    only (no check run); None when it finds none."""
    try:
        found = scan(root)
        listed = [c for c in candidates(found) if c.kind != "test"]
    except (OSError, RecursionError, ValueError):
        return None
    if any(is_test(f) for f in found.training()):
        return "the repo's tests train: `traingate init` would keep observing them, configuring no entry point"
    if not listed:
        return None
    best = listed[0]
    todo = f", after filling in {len(best.fill_in)} value(s)" if best.fill_in else ""
    return f"`traingate init` would configure {best.label} ({best.where}){todo}"
