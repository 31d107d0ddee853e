"""The correctness stage's rules: training bugs that run fine and pass the tests, and training that got worse than the baseline's.

Ids, severities and texts are the report's contract (docs/categories.md is generated from them).
"""

from __future__ import annotations

from traingate.stages.api import Blocks, Category, Rule, Severity

STAGE = "correctness"

# The stage's categories (`traingate explain CATEGORY`); a finding's category is one of these objects.
INEFFECTIVE_STEP = Category("ineffective-step")
UNUSED_PARAMETER = Category("unused-parameter")
GRAD_ACCUMULATION = Category("grad-accumulation")
UNSHUFFLED_TRAINING = Category("unshuffled-training")
NO_LEARNING = Category("no-learning")
DDP_DIVERGENCE = Category("ddp-divergence")
STALE_GRADIENTS = Category("stale-gradients")
TRAIN_EVAL_MODE = Category("train-eval-mode")
LOSS_INPUT_MISMATCH = Category("loss-input-mismatch")
BATCH_MIXING = Category("batch-mixing")
GRADIENT_CLIPPING = Category("gradient-clipping")
DATA_LEAKAGE = Category("data-leakage")
TRAINING_REGRESSION = Category("training-regression")

RULES: tuple[Rule, ...] = (
    Rule(
        category=INEFFECTIVE_STEP, stage=STAGE, severity=Severity.HIGH,
        description="an optimizer step changed none of its parameters, or a trained parameter never changed",
        check="Runs the entrypoint with optimizer step hooks that fingerprint every parameter of the optimizer's groups right before and right after each `step()`; "
        "at a step that changed nothing, it states the cause it saw: gradients cleared between the last backward and the step (the clearing `zero_grad()` and the backward named), "
        "a learning rate of 0 (the scheduler named), a backward that left the parameters without a gradient (the loss does not reach them), every parameter frozen, or no backward since the previous step.",
        measure="Observed: each parameter's exact sum, L2 norm and sampled elements across each step (an EMA update between steps does not count); the latest backward and "
        "`zero_grad()` call, the gradients present after the backward and at the step, each group's learning rate and the parameters' requires_grad.",
        blocks=Blocks.POLICY,
        impact="The step costs a forward and backward pass and teaches the model nothing; the finding names the cause it observed and its fix.",
        fix="Fix the cause the finding names: clear the gradients before the backward (not between backward and step), start a warm-up above 0, remove the cut between the loss "
        "and the parameters, or unfreeze the parameters the optimizer should train.",
        note="Low (not blocking by default), at the schedule's line, when the only steps with a learning rate of 0 are each optimizer's first step and later steps trained: "
        "a warm-up that starts at 0 by design.",
    ),
    Rule(
        category=UNUSED_PARAMETER, stage=STAGE, severity=Severity.HIGH,
        description="a model parameter is in no optimizer group, or is in one but never receives a gradient",
        check="Records every module the entrypoint constructs and every optimizer step; compares the modules' trainable parameters with the optimizers' groups and with the gradients present at each step.",
        measure="Observed: a requires_grad parameter that received a gradient but is held by no optimizer, or one in a group whose `.grad` stayed None over the whole run.",
        blocks=Blocks.POLICY,
        impact="Part of the model is never trained: a layer created after the optimizer, a second model never registered, or a branch cut off from the loss (a dead branch, `detach()`, `torch.no_grad()` around part of the forward).",
        fix="Build the optimizer after the whole model and from all of its parameters, and make sure the loss depends on the parameter shown (or set requires_grad=False on it if it is meant to stay fixed).",
        note="Medium (not blocking by default) when the module holding the parameters never ran a forward, or ran one with gradients recorded whose output no `detach()`, "
        "`.data` or `torch.no_grad()` cut and no loss used: its output reaches no loss (an unused head left in the optimizer); medium too when no cut was seen "
        "(the run's data may never take the path that uses them). High for a cut only where one was seen, located there, "
        "and at the optimizer's construction for parameters it left out (of several optimizers, the one over their siblings).",
    ),
    Rule(
        category=UNUSED_PARAMETER, stage=STAGE, severity=Severity.HIGH,
        description="The output layer is frozen: the layer whose output the loss is given has no parameter that trains",
        check="A training loss (gradients recorded, other parameters training) was given the output of a layer the target's own code built, at its initialisation "
        "(no `load_state_dict` reached it), all of whose parameters have requires_grad=False.",
        measure="The module behind the loss's input (through views) at the first call of each loss line, its parameters' requires_grad, and the `requires_grad_(False)` call or `requires_grad = False` "
        "assignment that froze it where one was seen (the finding is located there). "
        "A layer a library built or a checkpoint loaded (a pretrained output layer frozen on purpose) and a loss whose target the same layer produced (a perceptual loss) are not judged.",
        blocks=Blocks.POLICY,
        impact="The output layer stays at its random initialisation: the rest of the model trains to fit a fixed random projection, and the predictions stay near chance.",
        fix="Leave the new output layer trainable when freezing the rest (freeze the backbone's parameters only, then set `requires_grad=True` on the head's).",
        sub="frozen-output",
    ),
    Rule(
        category=GRAD_ACCUMULATION, stage=STAGE, severity=Severity.HIGH,
        description="gradient accumulation over k micro-batches does not give the gradient of one batch k times as large",
        check="With `accumulation_kwarg` and `batch_size_kwarg` configured: runs one update with accumulation k over micro-batches of b and one with accumulation 1 over a batch of k*b, same data and seeds.",
        measure="Measured: the relative difference of the gradients the first `step()` applies (norm and sampled elements), against `grad_accumulation_tolerance`.",
        blocks=Blocks.POLICY,
        impact="Accumulated updates are k times too large (the loss not divided by the accumulation steps) or otherwise not what a larger batch would give: changing the accumulation silently changes the effective learning rate.",
        fix="Divide each micro-batch's loss by the number of accumulation steps before backward (loss = loss / accumulation_steps).",
    ),
    Rule(
        category=GRAD_ACCUMULATION, stage=STAGE, severity=Severity.HIGH,
        description="Backward passes computed gradients that a `zero_grad()` cleared before any optimizer step used them",
        check="Runs the entrypoint with every backward call, optimizer step, `zero_grad()` (optimizer's or module's), `GradScaler.step`, `GradScaler.unscale_` and gradient clipping observed "
        "(the last three count as a step's decision on the gradients): a clear made outside a step, after backward calls that left gradients on the cleared parameters and with no step since, discards those backward passes when the next step applies gradients of backward calls made after the clear.",
        measure="Observed: the clearing line, the backward passes it discarded and the run's backward calls. A clear followed by a step with no backward in between is not counted here "
        "(gradients copied into `.grad` by hand, or a step that applies nothing: ineffective-step).",
        blocks=Blocks.POLICY,
        impact="Each step trains on the last micro-batch only: the others cost a forward and a backward pass and teach nothing, and the effective batch is k times smaller than configured.",
        fix="Clear the gradients only after the step that applies them: `optimizer.zero_grad()` next to `optimizer.step()`, under the same accumulation condition.",
        note="Medium (not blocking by default) when the line discarded at fewer clears than half the optimizer steps (a discard now and then); a line that discarded at one clear only is not reported.",
        sub="discarded-backward",
    ),
    Rule(
        category=UNSHUFFLED_TRAINING, stage=STAGE, severity=Severity.MEDIUM,
        description="a DataLoader that drives optimizer steps never shuffles, or its DistributedSampler repeats one order every epoch",
        check="Records every DataLoader, which one handed out the batch before each optimizer step, its sampler and `DistributedSampler.set_epoch` calls.",
        measure="Observed: a loader that drove steps with a SequentialSampler over more than one batch (the sampler its batch sampler draws from: a loader rebuilt around another loader's batch sampler, as Accelerate's `prepare` does, is judged by that one), or a shuffling DistributedSampler iterated over more than one epoch without `set_epoch`.",
        blocks=Blocks.POLICY,
        impact='Every epoch sees the data in the same order (sorted by class or time, often): gradients are biased and the model generalises worse.',
        fix='Pass shuffle=True (or a shuffling sampler) to the training DataLoader, and call sampler.set_epoch(epoch) at the start of every epoch with a DistributedSampler.',
        note='Medium by default, so it does not block: add `medium` to `policy.block_on` to block on it.',
    ),
    Rule(
        category=NO_LEARNING, stage=STAGE, severity=Severity.CRITICAL,
        description="the loss became NaN or inf during training, or (opt-in) does not fall when training on one repeated batch",
        check="Runs the entrypoint with every backward call's loss kept; with `overfit_steps` configured, once more with every DataLoader repeating its first batch, for that many optimizer steps.",
        measure="Observed: the first backward call whose loss (unscaled, when a GradScaler scaled it) is not finite, with its optimizer step and the line that called backward; "
        "reported when the run never recovers (its last loss or a parameter is still NaN or inf at the end), not for an overflow a GradScaler or guard skipped. "
        "On one batch: the first step's loss against the mean of the last three, against `overfit_min_reduction`.",
        blocks=Blocks.POLICY,
        impact="From that step on the gradients are NaN or inf and every update corrupts the weights: the run trains nothing.",
        fix="Find what produces the non-finite value before the step shown (log of 0, division by 0, a learning rate too high, fp16 overflow without a GradScaler).",
    ),
    Rule(
        category=DDP_DIVERGENCE, stage=STAGE, severity=Severity.HIGH,
        description="under torchrun, the ranks' model parameters differ after training, or every rank trained on the same batches",
        check="With `[tool.traingate.distributed] nproc` configured: runs the entrypoint under torchrun (`torch.distributed` elastic launch, gloo on the CPU, NCCL on CUDA) with that many ranks, "
        "then compares what each rank reports: every parameter and buffer of the modules it built (a digest of all bytes and evenly spaced samples), before the first and after the last optimizer step, "
        "the digest of every batch its DataLoaders handed out, its `torch.manual_seed` calls and the DistributedDataParallel wrappers it built.",
        measure="Observed: a parameter whose bytes differ between ranks after training (the first one named, with the largest difference over the compared elements), BatchNorm running statistics that differ "
        "where nothing synchronises them, or a training DataLoader that handed every rank the same batches.",
        blocks=Blocks.POLICY,
        impact="Each rank trains its own model: the checkpoint rank 0 saves is one of several models that drifted apart, and a DataLoader without a DistributedSampler makes every rank compute the same gradients, "
        "so N processes do the work of one.",
        fix="Wrap the model in DistributedDataParallel (which broadcasts rank 0's weights and averages the gradients), seed the weights the same on every rank, use SyncBatchNorm (or DDP's broadcast_buffers) "
        "for BatchNorm, and give the training DataLoader a DistributedSampler.",
    ),
    Rule(
        category=STALE_GRADIENTS, stage=STAGE, severity=Severity.HIGH,
        description="an optimizer step applied gradients carried over from before its previous step: nothing cleared them in between",
        check="Runs the entrypoint with every backward call and optimizer step observed: before each backward adds into `.grad`, the gradient every optimizer's parameters hold; "
        "at each step, how much of the gradient it applies was already there at that optimizer's previous step. Deliberate accumulation (k backward calls, one step, then `zero_grad`) clears "
        "before the next backward and is clean; a step with no backward since the previous one is not judged here (with a GradScaler that is `gradscaler-protocol/stale-gradients`).",
        measure="Observed: the L2 norm of each parameter's `.grad` before every backward call and at every step, on its own device, read when the run ends; a parameter whose gradient was never None or zero "
        "between two steps of its optimizer carries the earlier gradient into the later step. Reported: the steps affected, the norm carried over against the norm applied, and the lines of the step and of the backward call. "
        "Where the function that steps or calls backward holds a `zero_grad()` that did not run once (counted at its line), the finding is located at that call and names the branch that skipped it.",
        blocks=Blocks.POLICY,
        impact="Every step adds all earlier gradients: the update grows with the step count and keeps pushing in old directions, so the training diverges or crawls (momentum and Adam's moments compound it).",
        fix="Clear the gradients once per optimizer step: `optimizer.zero_grad(set_to_none=True)` right after `optimizer.step()` (or before the backward); when accumulating, after the step that ends the accumulation.",
    ),
    Rule(
        category=TRAIN_EVAL_MODE, stage=STAGE, severity=Severity.HIGH,
        description="optimizer steps taken with Dropout or BatchNorm in eval mode, or forward passes under no_grad with them in train mode",
        check="Runs the entrypoint with a forward hook on the modules whose behaviour depends on the mode (Dropout with p > 0, MultiheadAttention with dropout, BatchNorm and the other norm layers that track running statistics) "
        "and `Module.train`/`eval` recorded: which call set each module's mode, whether gradients were recorded in each forward, and which optimizer step followed.",
        measure="Observed: an optimizer step training a model whose forward ran those modules in eval mode, left there by `eval()`/`train(False)` on the whole model (a part frozen on purpose, "
        "a BatchNorm's own `eval()` or a backbone's, is not counted); or a forward under `torch.no_grad()`/`torch.inference_mode()`, called from the target's own code, with them in train mode, unless "
        "its outputs fed the loss of the same step (a target, teacher or EMA network, followed from its output to the next backward: that forward is training). "
        "Located at the `eval()` left on for training steps (the training forward named), at the line that called the model for a forward in train mode; the modules and their mode are named.",
        blocks=Blocks.POLICY,
        impact="In eval mode the training runs without dropout and normalises with stale running statistics instead of the batch's; in train mode, validation updates BatchNorm's running statistics with "
        "validation batches (the model changes) and reports metrics with dropout on.",
        fix="Call `model.train()` at the start of every training epoch (or after each evaluation), and `model.eval()` before validation or inference under `torch.no_grad()`.",
    ),
    Rule(
        category=LOSS_INPUT_MISMATCH, stage=STAGE, severity=Severity.HIGH,
        description="a loss was given the wrong input: probabilities or log-probabilities into cross_entropy, logits into nll_loss, sigmoid outputs into BCE-with-logits, or an input and a target whose shapes broadcast",
        check="Runs the entrypoint with `torch.nn.functional.cross_entropy`, `nll_loss` and `binary_cross_entropy_with_logits` wrapped (the `nn` loss modules call them): "
        "the first calls from each line of the target keep a few rows of the input, the op that produced it (its autograd node, through views) and the Softmax, LogSoftmax or Sigmoid module whose output it is.",
        measure="Observed on every sampled call of the line, read when the run ends: rows that are non-negative and sum to 1 (probabilities) or whose exp sums to 1 (log-probabilities) given to cross_entropy; "
        "rows whose exp sums to more than 1 (no log-probabilities do) or probabilities given to nll_loss; values all in [0, 1] given to binary_cross_entropy_with_logits. "
        "Located at the loss call, naming the layer or the functional call (`F.softmax`) that produced the input, at its line. Log-softmax twice gives the same loss, so it is low; values in [0, 1] with no sigmoid seen are medium; a line whose losses never recorded gradients (validation) is medium. "
        "Shapes: `mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss` and the BCE family (and their `nn` modules) are checked on every call, on the tensors whatever the warnings filter says: "
        "an input and a target whose shapes differ and broadcast beyond the input's shape ((B, 1) against (B,) gives (B, B)), both shapes named; "
        "`torch.distributions` `log_prob` alike, given values with the distribution's batch sizes in another layout.",
        blocks=Blocks.POLICY,
        impact="The loss squashes its input a second time: with probabilities into cross_entropy (or sigmoid outputs into BCE-with-logits) the loss barely moves and the gradients shrink, so the model learns slowly or not at all; "
        "logits into nll_loss is not a likelihood and is unbounded below, so training drives the logits up instead of learning the classes.",
        fix="Give cross_entropy and BCE-with-logits the raw logits (drop the final Softmax/Sigmoid from the training path, apply it only for predictions), and give nll_loss `log_softmax` outputs; "
        "give an element-wise loss an input and a target of the same shape (`pred.squeeze(-1)`, `y.view_as(pred)`).",
        note="High when observed on a training loss; low for log-softmax twice (redundant, same loss), medium when no sigmoid produced the [0, 1] values or only validation losses had them.",
    ),
    Rule(
        category=BATCH_MIXING, stage=STAGE, severity=Severity.HIGH,
        description="one sample's model output depends on other samples of the batch (the batch dimension is mixed up)",
        check="Keeps the model and its first training batch (the first outermost call of a module with trainable parameters made with gradients recorded, the batch's size from the DataLoader); "
        "when the run ends, calls the model again on that batch in eval mode (so BatchNorm's batch statistics do not count) and takes the gradient of the first and the last sample's outputs "
        "with respect to every sample's input (from the first floating module output for token ids). Where it is not zero, two more forwards put NaN into one sample each under a `TorchFunctionMode` "
        "to find the first op whose output depends on both.",
        measure="Observed: a nonzero gradient of sample i's outputs with respect to sample j's input, j != i. Located at the target's line that called the first op mixing the samples, "
        "naming an op before it that spread each sample over several indexes of the batch's dimension (`x.view(T, B, F)` where `transpose` was meant). "
        "Medium when no DataLoader said how many samples the batch has (dim 0 taken), or an output has two dimensions of the batch's size (pairwise scores by design); "
        "a forward with no tensor batch or no dimension of the batch's size is reported as not applicable in the stage's details.",
        blocks=Blocks.POLICY,
        impact="Each sample's prediction is computed from other samples: the model learns from data it should not see together, its outputs change with the batch it is in, and it does not work with a batch of one.",
        fix="Find the op shown: reorder dimensions with `transpose`/`permute` (not `view`/`reshape`), give reductions the right `dim`, and pass `batch_first=True` (or transpose) to RNNs and attention.",
        note="High when a DataLoader identified the batch's dimension; medium when dim 0 was assumed or an output is pairwise across the batch.",
    ),
    # -- clipping that clips nothing; evaluation samples that were trained on (docs/correctness.md) --
    Rule(
        category=GRADIENT_CLIPPING, stage=STAGE, severity=Severity.HIGH,
        description="gradient clipping ran before the backward whose gradients the step applies, so what is applied was never clipped",
        check="Wraps `clip_grad_norm_` and `clip_grad_value_` and the backward calls; at each optimizer step over the clipped parameters, checks whether a backward ran after the latest clip of each line.",
        measure="Observed: a clip that ran before the backward of the coming step (after `zero_grad()`, on cleared or old gradients), or whose clipped gradients a later backward added to before the step. "
        "Located at the clip, naming the backward it should follow. Clipping before `GradScaler.unscale_` is the concurrency stage's `gradscaler-protocol`.",
        blocks=Blocks.POLICY,
        impact="The gradients the optimizer applies are never clipped: a loss spike or an exploding gradient goes through at full size, which the clipping was there to prevent.",
        fix="Clip after the last backward of the step and right before `optimizer.step()` (with a GradScaler, after `scaler.unscale_(optimizer)`).",
    ),
    Rule(
        category=DATA_LEAKAGE, stage=STAGE, severity=Severity.HIGH,
        description="samples fed to evaluation were also fed to training steps: the evaluation score is optimistic",
        check="Fingerprints every sample of every batch the DataLoaders hand out (its first tensor's sampled elements); when the run ends, compares the samples of each loader that drove "
        "optimizer steps with those of each loader that drove none (an evaluation loader).",
        measure="Observed: the share of an evaluation loader's distinct samples that a training loader also handed out, with the two loaders' lines. "
        "A pass over the training data on purpose (a train-accuracy pass: a loader over the same dataset object as the training loader, or the training loader itself) is not judged; "
        "a loader whose first epoch handed out one content twice (data with repeated samples) is not compared; an overlap below 5% of the evaluated samples (or of a single sample) is taken for duplicates in the data.",
        blocks=Blocks.POLICY,
        impact="The model is evaluated on data it was trained on: validation loss and accuracy are optimistic, early stopping and model selection are misled.",
        fix="Split the data once (one `random_split` call, or one permutation of indexes, with a fixed generator) and build the training and evaluation sets from that one split.",
    ),
    Rule(
        category=TRAINING_REGRESSION, stage=STAGE, severity=Severity.HIGH,
        description="a training fact that held in the baseline's run fails in this one (the loss stopped falling, the learning rate collapsed, a weight matrix became symmetric, "
        "a module stopped changing, fewer samples per epoch, a loss given the wrong kind of input, evaluation outputs that differ for the same input)",
        check="With `--baseline`, compares the training facts the instrumented run records (the loss of each step, each optimizer group's learning rate, gradient norm and "
        "relative parameter change at each step, each top-level module's change over the run, the distinct rows of each weight matrix at the end, the samples the "
        "training loaders handed out per epoch, the kind, shape and dtype of each classification loss's input, and whether a model run twice under no_grad on "
        "the same input gave the same output) with the baseline report's.",
        measure="Measured, both numbers stated. The loss (mean of the first tenth of the steps against the last tenth's): the baseline's fell by at least 20% and this run's by less than a quarter as much "
        "(a working change that learns slower, with half the steps or a 2.5 times lower learning rate, keeps more). "
        "A module held by an optimizer in both runs changed by less than 1% of its baseline change over the run. "
        "Samples per epoch: fewer than half the baseline's (another batch size keeps them). "
        "A loss's input: the kind the loss expects in the baseline, one it does not now (cross_entropy given probabilities, nll_loss given logits). "
        "Evaluation: every check gave the same output twice in the baseline and one does not now. "
        "The learning rate: a group's last-step lr over its first-step lr is more than 100 times smaller than the baseline's (another base lr or optimizer keeps the ratio). "
        "Symmetry: a weight matrix of the same name had at least half its rows distinct in the baseline and now has a share of distinct rows below 90% of the baseline's (a wider layer keeps its rows distinct). "
        "A loss that stopped falling is stated in the nearer fact's finding where there is one, and a regression a named rule of this run found (loss-input-mismatch, unused-parameter) is that rule's finding alone (one finding per cause). A fact that differs but is not worse is listed in the stage's details as changed, not worse; without a baseline nothing is compared.",
        blocks=Blocks.POLICY,
        impact="The change runs and passes its tests but trains worse than the version it replaces: the model it produces is worse.",
        fix="Look at the located line (the scheduler's step(), the initialisation call) or the change around the data and the loss; an intended change is taken as the next baseline once reviewed.",
    ),
)
CATEGORIES: frozenset[Category] = frozenset(rule.category for rule in RULES)
