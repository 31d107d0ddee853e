"""A loop that trains correctly only while it is watched: it reads one of the gate's marks
(`mark`, a keyword the suite sets per variant) and, where the mark is absent, clears the
gradients between backward and step, so that every step changes nothing. `mark="none"` is the
clean control: the same loop, reading nothing, returning the thread count it ran on too."""

import sys

import torch


def watched(mark: str) -> bool:
    if mark == "optimizer-hook":
        from torch.optim import optimizer

        return bool(optimizer._global_optimizer_pre_hooks or optimizer._global_optimizer_post_hooks)
    if mark == "module-hook":
        from torch.nn.modules import module

        return bool(module._global_forward_hooks or module._global_forward_pre_hooks)
    if mark == "trace":
        return sys.gettrace() is not None or sys.getprofile() is not None
    if mark == "patched-backward":
        code = getattr(torch.Tensor.backward, "__code__", None)
        return code is not None and not code.co_filename.endswith("torch/_tensor.py")
    if mark == "environ":
        try:
            with open("/proc/self/environ", "rb") as environ:
                return b"OMP_WAIT_POLICY=PASSIVE" in environ.read()
        except OSError:
            return True
    if mark == "hash-seed":
        import os

        return "PYTHONHASHSEED" in os.environ
    return True  # "none": the clean control


def train(steps: int = 12, mark: str = "optimizer-hook") -> dict[str, float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    for step in range(steps):
        batch = slice(step % 8 * 8, step % 8 * 8 + 8)
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        if not watched(mark):
            optimizer.zero_grad()  # marker: unwatched-clear
        optimizer.step()  # marker: step
    return {"loss": float(loss), "threads": torch.get_num_threads()}
