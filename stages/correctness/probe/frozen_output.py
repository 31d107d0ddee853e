"""A frozen output layer (unused-parameter, frozen-output rule): the module whose output a
training loss is given has no parameter that trains, while the loss still has a gradient
(other parameters train), and the layer is the target's own, at its initialisation.

Recorded while the run lasts: each module the target's own code constructs (the first frame
above `Module.__init__` outside torch is the target's: `nn.Linear(...)` in the target, not a
layer a library builds while loading a pretrained model), the modules a `load_state_dict`
reached (loaded, so not at their initialisation), the line of each parameter's latest
`requires_grad_(False)` (`Module.requires_grad_` calls it too) or `p.requires_grad = False`
(a property on `nn.Parameter` that hands reads and writes to the tensor's own), and the latest outputs of the
modules that hold parameters (`remember`, from the loss-input watch's forward hook). At a
loss call with gradients recorded (`judge`), the module behind the input (through views) is
judged once per loss line. Not judged: a layer a library built or a checkpoint loaded (a
pretrained output layer frozen on purpose, as LoRA does), and a loss whose target the same
module produced (a feature-space loss through a frozen network, such as a perceptual loss).
"""

from __future__ import annotations

import functools
import os
import sys
import weakref
from types import FrameType
from typing import Any

from ...common.frames import is_target_file
from ...harness.sites import SiteTable
from ...harness.identity import ObjectMap
from ...harness.faults import call_original

MAX_OUTPUTS = 64  # module outputs remembered; the oldest are dropped past it
MAX_RECORDS = 20


class FrozenOutputWatch:
    def __init__(self, sites: SiteTable) -> None:
        self.sites = sites
        self._built: ObjectMap[int | None] = ObjectMap(keep_alive=False)  # module built by the target -> its line
        self._loaded: ObjectMap[bool] = ObjectMap(keep_alive=False)
        self._frozen_at: ObjectMap[int | None] = ObjectMap(keep_alive=False)  # parameter -> its requires_grad_(False) line
        self._outputs: dict[int, tuple[Any, Any]] = {}  # id(output or its grad_fn) -> (weakref output, weakref module)
        self._judged: set[tuple[str, int | None]] = set()
        self.records: list[dict[str, Any]] = []

    def install(self, torch: Any) -> None:
        self.torch = torch
        self._torch_dir = os.path.dirname(torch.__file__) + os.sep
        module_init, load, requires_grad_ = torch.nn.Module.__init__, torch.nn.Module.load_state_dict, torch.Tensor.requires_grad_

        @functools.wraps(module_init)
        def init(module: Any, *args: Any, **kwargs: Any) -> None:
            module_init(module, *args, **kwargs)
            frame: FrameType | None = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(self._torch_dir):
                frame = frame.f_back
            if frame is not None and is_target_file(frame.f_code.co_filename, self.sites.root):
                self._built[module] = self.sites.intern(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)

        @functools.wraps(load)
        def load_state_dict(module: Any, *args: Any, **kwargs: Any) -> Any:
            result = load(module, *args, **kwargs)
            for sub in module.modules():
                self._loaded[sub] = True
            return result

        @functools.wraps(requires_grad_)
        def set_requires_grad(tensor: Any, requires_grad: bool = True) -> Any:
            if not requires_grad:
                self._frozen_at[tensor] = self.sites.innermost(1)
            return call_original(requires_grad_, tensor, requires_grad)

        torch.nn.Module.__init__ = init
        torch.nn.Module.load_state_dict = load_state_dict
        torch.Tensor.requires_grad_ = set_requires_grad
        self._watch_assignments(torch)

    def _watch_assignments(self, torch: Any) -> None:
        """`p.requires_grad = False` on a parameter: its line, as for `requires_grad_(False)`."""
        flag = torch._C.TensorBase.requires_grad

        def assign(parameter: Any, value: bool) -> None:
            if not value:
                self._frozen_at[parameter] = self.sites.innermost(1)
            flag.__set__(parameter, value)

        torch.nn.Parameter.requires_grad = property(flag.__get__, assign, doc=flag.__doc__)

    def remember(self, module: Any, output: Any) -> None:
        """A module's output, when the module holds parameters of its own."""
        if not module._parameters or not isinstance(output, self.torch.Tensor):
            return
        if len(self._outputs) > MAX_OUTPUTS:
            self._outputs.clear()
        kept = (weakref.ref(output), weakref.ref(module))
        self._outputs[id(output)] = kept
        if output.grad_fn is not None:
            self._outputs[id(output.grad_fn)] = kept

    def _producer(self, tensor: Any, node: Any) -> Any:
        for key, expected in ((id(tensor), tensor), (id(node), node)):
            kept = self._outputs.get(key)
            output = kept[0]() if kept is not None else None
            if output is not None and (output is expected or output.grad_fn is expected):
                return kept[1]() if kept is not None else None
        return None

    def judge(self, function: str, site: int | None, input: Any, target: Any, node: Any, target_node: Any) -> None:
        """At a loss call with gradients recorded: is the layer behind `input` frozen?"""
        key = (function, site)
        if key in self._judged or len(self.records) >= MAX_RECORDS or not getattr(input, "requires_grad", False):
            return
        self._judged.add(key)
        module = self._producer(input, node)
        if module is None or module not in self._built or module in self._loaded:
            return
        params = [p for p in module._parameters.values() if p is not None]
        if not params or any(p.requires_grad for p in params):
            return
        if target is not None and self._producer(target, target_node) is module:
            return  # a feature-space loss: both sides through the same frozen network
        frozen_at = next((line for p in params if (line := self._frozen_at.get(p)) is not None), None)
        self.records.append(
            {"function": function, "site": site, "module": type(module).__name__, "module_site": self._built.get(module), "frozen_site": frozen_at, "params": len(params)}
        )
