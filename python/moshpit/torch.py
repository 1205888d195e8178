# SPDX-License-Identifier: BSD-3-Clause
"""PyTorch on moshpit: an optimizer wrapper that averages gradients or
parameters, a model averager for PostLocalSGDOptimizer, and a DDP
communication hook.

Every average here goes through persistent flat float32 buffers, one per
dtype, filled in the order of the parameters: the same order on every peer,
and the same buffer address every step, which the sparse codecs' error
feedback (keyed by buffer) needs.
"""

import errno as _errno
import json
from typing import Any, Callable, Iterable, Optional, Union

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.averagers import ModelAverager

from . import Context, Handle, InvalidArgument, Result

__all__ = ["Optimizer", "ParameterAverager", "DDPHookState", "ddp_comm_hook",
           "TensorAverager", "publish_state", "load_state_from_peers"]


def _dtype_key(t: torch.Tensor) -> str:
    return str(t.dtype)


class TensorAverager:
    """Averages a fixed list of floating-point tensors, on the CPU or on one
    CUDA device, in place through one flat float32 buffer per dtype (buckets in dtype-name order, tensors
    in list order). ``start`` copies the tensors in and starts the averages;
    ``finish`` waits and returns the averaged flat buffers, which the
    caller applies (``copy_back``, or a delta of its own)."""

    def __init__(self, ctx: Context, tensors: list[torch.Tensor], uncompressed: bool = False):
        self.ctx = ctx
        self.uncompressed = uncompressed
        self.buckets: dict[str, list[torch.Tensor]] = {}
        # All on one device: the flat buffers live there (a CUDA one is
        # averaged on the GPU where the library's kernels run).
        self.device = tensors[0].device if tensors else torch.device("cpu")
        for t in tensors:
            if not torch.is_floating_point(t):
                raise InvalidArgument(_errno.EINVAL, f"a {t.dtype} tensor: only floating-point "
                                      "tensors are averaged", "moshpit.torch")
            if t.device.type not in ("cpu", "cuda") or t.device != self.device:
                raise InvalidArgument(_errno.EINVAL, f"a tensor on {t.device} beside one on "
                                      f"{self.device}: moshpit.torch averages CPU tensors, or "
                                      "CUDA tensors of one device", "moshpit.torch")
            self.buckets.setdefault(_dtype_key(t), []).append(t)
        self.keys = sorted(self.buckets)
        self.sources = [(t.data_ptr(), t.numel(), t.dtype) for t in tensors]
        self.flat = {k: torch.zeros(sum(t.numel() for t in self.buckets[k]), dtype=torch.float32,
                                    device=self.device)
                     for k in self.keys}
        self.handles: list[Handle] = []

    def fill(self) -> None:
        with torch.no_grad():
            for k in self.keys:
                off = 0
                for t in self.buckets[k]:
                    n = t.numel()
                    self.flat[k][off:off + n].copy_(t.reshape(-1))
                    off += n

    def copy_back(self) -> None:
        with torch.no_grad():
            for k in self.keys:
                off = 0
                for t in self.buckets[k]:
                    n = t.numel()
                    t.copy_(self.flat[k][off:off + n].view_as(t))
                    off += n

    def matches(self, tensors: list[torch.Tensor]) -> bool:
        """Whether these are the tensors it was built for (the same memory:
        ``p.data`` is a new object each time, on the same storage)."""
        return self.sources == [(t.data_ptr(), t.numel(), t.dtype) for t in tensors]

    def launch(self, weight: float = 1.0) -> None:
        """Start the averages of the flat buffers as they are."""
        self.handles = [self.ctx.average_async(self.flat[k], weight, uncompressed=self.uncompressed)
                        for k in self.keys if self.flat[k].numel()]

    def start(self, weight: float = 1.0) -> None:
        self.fill()
        self.launch(weight)

    def finish(self, timeout: Optional[float] = None) -> list[Result]:
        handles, self.handles = self.handles, []
        results = []
        error = None
        for h in handles:  # wait for all, even after a failure: each holds a buffer
            try:
                results.append(h.wait(timeout))
            except Exception as e:  # noqa: BLE001 - re-raised below
                error = error or e
        if error:
            raise error
        return results

    def pending(self) -> bool:
        return bool(self.handles)

    def done(self) -> bool:
        return all(h.done() for h in self.handles)

    def average(self, weight: float = 1.0) -> list[Result]:
        """Blocking: fill, average, copy back."""
        self.fill()
        results = [self.ctx.average(self.flat[k], weight, uncompressed=self.uncompressed)
                   for k in self.keys if self.flat[k].numel()]
        self.copy_back()
        return results


def _params_of(params: Any) -> list[torch.Tensor]:
    """Parameters from an iterable of tensors or of param groups (dicts)."""
    out: list[torch.Tensor] = []
    for p in params:
        if isinstance(p, dict):
            out.extend(p["params"])
        else:
            out.append(p)
    return out


class Optimizer(torch.optim.Optimizer):
    """Wrap a torch optimizer so that peers train together.

    ``mode="gradients"``: each ``step()`` averages the gradients of every
    parameter (missing gradients count as zeros) before the wrapped step,
    weighted by ``batch_size`` when given: N peers with equal shards follow
    single-process full-batch SGD.

    ``mode="parameters"`` (local SGD, Moshpit SGD; hivemind's
    ``use_local_updates=True``): peers step on their own, and every
    ``every`` steps the parameters and the optimizer's floating-point state
    are averaged in the background while training goes on. When the average
    ends, at a later step, each parameter gets the average's change
    (average - snapshot) added to its current value, keeping the local steps
    taken meanwhile. A state tensor that is a running average (SGD's
    momentum buffer, Adam's moments) gets the same change, decayed as the
    optimizer decayed the snapshot in those steps (its momentum or beta to
    the power of their number), so that an average that ends late moves the
    state as one that ended at once would have; any other state tensor is
    replaced by its average. The next
    average starts only once the previous one has been applied.

    ``optimizer`` is a torch optimizer or, as in hivemind, a callable that
    makes one from ``params``. ``codec=None`` averages with the context's
    codec; ``"none"`` sends these averages uncompressed (fp32) whatever the
    context's codec; another codec must be the context's own (codecs are set
    per run, MP_CODEC)."""

    def __init__(self, ctx: Context, params: Optional[Iterable[Any]] = None,
                 optimizer: Union[torch.optim.Optimizer, Callable[..., torch.optim.Optimizer],
                                  None] = None,
                 mode: str = "gradients", every: int = 1, codec: Optional[str] = None,
                 average_state: bool = True) -> None:
        if optimizer is None:
            raise InvalidArgument(_errno.EINVAL, "optimizer is required", "Optimizer")
        if not isinstance(optimizer, torch.optim.Optimizer):
            if params is None:
                raise InvalidArgument(_errno.EINVAL, "params are required to build the "
                                      "optimizer", "Optimizer")
            optimizer = optimizer(params)
        if mode not in ("gradients", "parameters"):
            raise InvalidArgument(_errno.EINVAL, f"mode {mode!r}: \"gradients\" or "
                                  "\"parameters\"", "Optimizer")
        if not isinstance(every, int) or every < 1:
            raise InvalidArgument(_errno.EINVAL, f"every={every}: a positive integer",
                                  "Optimizer")
        if codec is not None and codec != "none" and codec.split(":")[0] != ctx.codec:
            raise InvalidArgument(_errno.EINVAL, f"codec {codec!r}: the context averages with "
                                  f"{ctx.codec!r}; the codec is set per run (Context(codec=...) "
                                  "or MP_CODEC), per average only \"none\" can be chosen",
                                  "Optimizer")
        self.ctx = ctx
        self.optimizer = optimizer
        self.mode = mode
        self.every = every
        self.average_state = average_state
        self.uncompressed = codec == "none"
        self.local_step = 0
        self.last_result: Optional[list[Result]] = None
        # Share the wrapped optimizer's groups and state, as hivemind does,
        # so that LR schedulers and state_dict see one optimizer.
        self.param_groups = optimizer.param_groups
        self.defaults = optimizer.defaults
        self.state = optimizer.state
        self._params = _params_of(optimizer.param_groups)
        self._grads: Optional[TensorAverager] = None
        self._avg: Optional[TensorAverager] = None
        self._snap: dict[str, torch.Tensor] = {}
        self._snap_step = 0
        self._decay: dict[int, float] = {}

    # torch.optim.Optimizer's own __init__ is not called: these delegate.
    def zero_grad(self, set_to_none: bool = False) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)
        self.state = self.optimizer.state
        self._avg = None  # the state tensors are new ones

    def add_param_group(self, param_group: dict) -> None:
        raise InvalidArgument(_errno.EINVAL, "add_param_group: every peer must average the same "
                              "tensors; build the optimizer with all groups", "Optimizer")

    def __repr__(self) -> str:
        return f"moshpit.torch.Optimizer({self.optimizer!r}, mode={self.mode!r})"

    def step(self, closure: Optional[Callable[[], Any]] = None,
             batch_size: Optional[float] = None) -> Any:
        if self.mode == "gradients":
            return self._step_gradients(closure, batch_size)
        return self._step_parameters(closure)

    def _step_gradients(self, closure: Optional[Callable[[], Any]],
                        batch_size: Optional[float]) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self._params]
        if self._grads is None or not self._grads.matches(grads):
            # First step, or gradients replaced (zero_grad(set_to_none=True)):
            # new views, the same flat buffers where the sizes match, so that
            # the error-feedback residue stays with them.
            old = self._grads
            self._grads = TensorAverager(self.ctx, grads, self.uncompressed)
            if old is not None:
                for k in self._grads.keys:
                    if k in old.flat and old.flat[k].numel() == self._grads.flat[k].numel():
                        self._grads.flat[k] = old.flat[k]
        self.last_result = self._grads.average(1.0 if batch_size is None else batch_size)
        self.optimizer.step()
        self.local_step += 1
        return loss

    def _state_entries(self) -> list[tuple[torch.Tensor, str, torch.Tensor]]:
        out = []
        if not self.average_state:
            return out
        for p in self._params:
            for name in sorted(self.optimizer.state.get(p, {})):
                v = self.optimizer.state[p][name]
                # Step counters (0-d) are local: averaging them means nothing.
                if isinstance(v, torch.Tensor) and torch.is_floating_point(v) and v.dim() > 0:
                    out.append((p, name, v))
        return out

    def _state_tensors(self) -> list[torch.Tensor]:
        return [v for _, _, v in self._state_entries()]

    def _state_decay(self, p: torch.Tensor, name: str) -> Optional[float]:
        """How much one step of the optimizer keeps of state @name of @p
        (a running average's factor), or None when it is not known."""
        group = next((g for g in self.optimizer.param_groups
                      if any(q is p for q in g["params"])), None)
        if group is None:
            return None
        if name == "momentum_buffer" and isinstance(group.get("momentum"), (int, float)):
            return float(group["momentum"])
        betas = group.get("betas")
        if isinstance(betas, (tuple, list)) and len(betas) == 2:
            if name == "exp_avg":
                return float(betas[0])
            if name == "exp_avg_sq":
                return float(betas[1])
        return None

    def _step_parameters(self, closure: Optional[Callable[[], Any]]) -> Any:
        loss = self.optimizer.step(closure)
        self.local_step += 1
        if self._avg is not None and self._avg.pending() and self._avg.done():
            self._apply()
        if self.local_step % self.every == 0:
            if self._avg is not None and self._avg.pending():
                self._apply()  # waits: one average per period at most
            self._start()
        return loss

    def _start(self) -> None:
        tensors = list(self._params) + self._state_tensors()
        if self._avg is None or not self._avg.matches(tensors):
            self._avg = TensorAverager(self.ctx, tensors, self.uncompressed)
        self._avg.fill()
        self._snap = {k: v.clone() for k, v in self._avg.flat.items()}
        self._snap_step = self.local_step
        self._decay = {id(v): d for p, name, v in self._state_entries()
                       if (d := self._state_decay(p, name)) is not None}
        self._avg.launch()

    def _apply(self) -> None:
        assert self._avg is not None
        self.last_result = self._avg.finish()
        params = {id(p) for p in self._params}
        # Optimizer steps taken since the snapshot: a running average has
        # decayed the snapshot's part by its factor to this power since.
        # (Replacing it with the average, as before, threw those steps'
        # part of it away; applied a whole period late, that made training
        # diverge: test_parameter_mode_converges under load.)
        steps = self.local_step - self._snap_step
        with torch.no_grad():
            for k in self._avg.keys:
                off = 0
                flat, snap = self._avg.flat[k], self._snap[k]
                for t in self._avg.buckets[k]:
                    n = t.numel()
                    avg = flat[off:off + n].view_as(t)
                    change = avg - snap[off:off + n].view_as(t)
                    decay = self._decay.get(id(t))
                    if id(t) in params:
                        t.add_(change.to(t.dtype))
                    elif decay is not None:
                        t.add_((change * decay ** steps).to(t.dtype))
                    else:
                        t.copy_(avg)
                    off += n

    def finish(self, timeout: Optional[float] = None) -> None:
        """Wait for a background average still running and apply it (call
        before evaluating or saving in parameters mode)."""
        if self._avg is not None and self._avg.pending():
            self._apply()


class ParameterAverager(ModelAverager):
    """torch.distributed's model averager on moshpit: for
    ``torch.distributed.optim.PostLocalSGDOptimizer`` in place of
    ``PeriodicModelAverager``. Averages the parameters every ``period``
    steps once ``warmup_steps`` have passed (blocking, as
    PeriodicModelAverager does); no process group is needed."""

    def __init__(self, ctx: Context, period: int = 1, warmup_steps: int = 0,
                 codec: Optional[str] = None) -> None:
        if not isinstance(period, int) or period < 1 or warmup_steps < 0:
            raise InvalidArgument(_errno.EINVAL, f"period={period}, warmup_steps="
                                  f"{warmup_steps}: period >= 1, warmup_steps >= 0",
                                  "ParameterAverager")
        # ModelAverager's own __init__ asks for a process group: none here.
        self.process_group = None
        self.step = 0
        self.ctx = ctx
        self.period = period
        self.warmup_steps = warmup_steps
        self.uncompressed = codec == "none"
        self._avg: Optional[TensorAverager] = None
        self.last_result: Optional[list[Result]] = None

    def average_parameters(self, params: Any) -> None:
        if self.step >= self.warmup_steps and (self.step - self.warmup_steps) % self.period == 0:
            tensors = [p.data for p in _params_of(params)]
            if self._avg is None or not self._avg.matches(tensors):
                self._avg = TensorAverager(self.ctx, tensors, self.uncompressed)
            self.last_result = self._avg.average()
        self.step += 1


class DDPHookState:
    """State of :func:`ddp_comm_hook` (DDP checks the hook's annotations, so
    this module does not postpone them): the context, and the buckets of the
    step seen so far."""

    def __init__(self, ctx: Context, codec: Optional[str] = None) -> None:
        self.ctx = ctx
        self.uncompressed = codec == "none"
        self.pending: list[tuple[torch.Tensor, torch.futures.Future]] = []
        self.flat: dict[str, torch.Tensor] = {}
        self.last_result: Optional[list[Result]] = None
        self.buckets = 0   # buckets the hook was given, over all steps
        self.averages = 0  # moshpit averages it ran: one per step and dtype


def ddp_comm_hook(state: DDPHookState,
                  bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: ``model.register_comm_hook(DDPHookState(ctx),
    ddp_comm_hook)``. The buckets of one backward pass are held until the
    last one, then averaged in one moshpit average per dtype, and every
    bucket's future completes with its mean: one average per step, not one
    per bucket. A failed average fails every bucket's future, so DDP raises."""
    fut: torch.futures.Future = torch.futures.Future()
    buf = bucket.buffer()
    state.pending.append((buf, fut))
    state.buckets += 1
    if not bucket.is_last():
        return fut
    pending, state.pending = state.pending, []
    try:
        groups: dict[str, list[torch.Tensor]] = {}
        for t, _ in pending:
            groups.setdefault(_dtype_key(t), []).append(t)
        results = []
        for k in sorted(groups):
            n = sum(t.numel() for t in groups[k])
            flat = state.flat.get(k)
            if flat is None or flat.numel() != n:
                flat = state.flat[k] = torch.empty(n, dtype=torch.float32)
            torch.cat([t.reshape(-1).float() for t in groups[k]], out=flat)
            results.append(state.ctx.average(flat, uncompressed=state.uncompressed))
            state.averages += 1
            off = 0
            for t in groups[k]:
                t.copy_(flat[off:off + t.numel()].view_as(t))
                off += t.numel()
        state.last_result = results
    except Exception as e:  # noqa: BLE001 - handed to every future
        for _, f in pending:
            f.set_exception(e)
        return fut
    for t, f in pending:
        f.set_result(t)
    return fut


# ---------------------------------------------------------------- state download

def _layout(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer],
            step: int) -> tuple[list[torch.Tensor], bytes]:
    """The tensors of a training state, in a fixed order (the model's
    state_dict, then the optimizer's state tensors), and the metadata that
    describes them: names, dtypes, shapes, and the optimizer's state_dict
    with each tensor replaced by its index (JSON: nothing is unpickled)."""
    sd = model.state_dict()
    tensors = [t.detach() for t in sd.values()]
    opt_tensors: list[torch.Tensor] = []

    def strip(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            opt_tensors.append(obj.detach())
            return {"__tensor__": len(opt_tensors) - 1}
        if isinstance(obj, dict):
            return {"__dict__": [[strip(k), strip(v)] for k, v in obj.items()]}
        if isinstance(obj, (list, tuple)):
            return {"__tuple__" if isinstance(obj, tuple) else "__list__":
                    [strip(v) for v in obj]}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        raise InvalidArgument(_errno.EINVAL, f"optimizer state holds a {type(obj).__name__}, "
                              "which state download cannot carry", "publish_state")

    skeleton = strip(optimizer.state_dict()) if optimizer is not None else None
    meta = {
        "step": int(step),
        "model": [[k, str(t.dtype), list(t.shape)] for k, t in sd.items()],
        "optimizer": skeleton,
        "opt_tensors": [[str(t.dtype), list(t.shape)] for t in opt_tensors],
    }
    return [t.contiguous() for t in tensors + opt_tensors], json.dumps(meta).encode()


def publish_state(ctx: Context, model: torch.nn.Module,
                  optimizer: Optional[torch.optim.Optimizer] = None, step: int = 0) -> None:
    """Publish the model's state_dict (and the optimizer's state) as this
    peer's state, version ``step``, for peers that join
    (:func:`load_state_from_peers`). The tensors are copied: training may go
    on at once. Start the service once with ``ctx.serve_state()``."""
    tensors, meta = _layout(model, optimizer, step)
    ctx.publish_state(tensors, version=step, meta=meta)


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.split(".", 1)[1], None)
    if not isinstance(dt, torch.dtype):
        raise InvalidArgument(_errno.EINVAL, f"unknown dtype {name!r} in a state's metadata",
                              "load_state_from_peers")
    return dt


def load_state_from_peers(ctx: Context, model: torch.nn.Module,
                          optimizer: Optional[torch.optim.Optimizer] = None,
                          sources: Iterable[str] = (), timeout: float = 300.0) -> int:
    """Download the most advanced state among the state services at
    ``sources`` (``ctx.state_address`` of peers that publish) into ``model``
    (in place, into its own tensors) and ``optimizer``; return its step.
    The model must have the same names, dtypes and shapes as the server's
    (else InvalidArgument naming the first that differs)."""
    sources = list(sources)
    info = ctx.query_state(sources, timeout)
    layout = json.loads(info.meta)
    sd = model.state_dict()
    want = [[k, str(t.dtype), list(t.shape)] for k, t in sd.items()]
    if layout["model"] != want:
        for a, b in zip(layout["model"] + [None] * len(want), want + [None] * len(layout["model"])):
            if a != b:
                raise InvalidArgument(_errno.EINVAL, f"the peers' model differs from this one: "
                                      f"theirs has {a}, this one {b}", "load_state_from_peers")
    if optimizer is not None and layout["optimizer"] is None:
        raise InvalidArgument(_errno.EINVAL, "the peers published no optimizer state",
                              "load_state_from_peers")
    dest = []
    back = []
    for t in sd.values():
        if t.is_contiguous():
            dest.append(t)
        else:
            tmp = torch.empty_like(t, memory_format=torch.contiguous_format)
            dest.append(tmp)
            back.append((t, tmp))
    opt_dest = [torch.empty(shape, dtype=_dtype(dt)) for dt, shape in layout["opt_tensors"]]
    got = ctx.fetch_state(sources, dest + opt_dest, timeout)
    if got.meta != info.meta:
        # Published again between the query and the download, with the same
        # lengths: the metadata that goes with the bytes is the new one.
        layout = json.loads(got.meta)
    with torch.no_grad():
        for t, tmp in back:
            t.copy_(tmp)
    if optimizer is not None:
        def build(obj: Any) -> Any:
            if isinstance(obj, dict):
                if "__tensor__" in obj:
                    return opt_dest[obj["__tensor__"]]
                if "__dict__" in obj:
                    return {build(k): build(v) for k, v in obj["__dict__"]}
                if "__tuple__" in obj:
                    return tuple(build(v) for v in obj["__tuple__"])
                if "__list__" in obj:
                    return [build(v) for v in obj["__list__"]]
            return obj
        optimizer.load_state_dict(build(layout["optimizer"]))
    return int(layout["step"])
