"""Step and collective-wait timing for torch jobs that do not report telemetry themselves.

Installed by the launcher in every rank before the job's script runs: as the script that starts
a cold rank (``python -u _steptime.py SCRIPT ARGS`` or ``... _steptime.py -m MODULE ARGS``,
which runs the script as ``python -u SCRIPT ARGS`` would), and by the node's warm process
(:mod:`..warm._zygote`) in each rank it forks. Nothing happens until torch is imported (a script
without torch pays for one import hook); then

- the creation of the job's first torch optimizer (``torch.optim.Optimizer.__init__``, wrapped)
  appends a ``stepping`` record: the rank says it will step, so the control loop gives its first
  step ``health.startup_grace_s`` from then (:mod:`aicluster.control.loop.health`); a script
  that creates no optimizer and reports no step is never taken for hung;
- a global optimizer step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``)
  marks step boundaries: a step is one ``step()`` of the first optimizer that stepped;
- the time a collective is in flight is measured: ``torch.distributed``'s synchronous
  collectives (``all_reduce``, ``broadcast``, ``barrier``, ...) around the call, and DDP's
  gradient all-reduce through a comm hook (the default all-reduce, or the job's own hook,
  wrapped) from the bucket's launch to its future's completion;
- at each boundary one telemetry line is appended to the rank's file
  (``AICLUSTER_TELEMETRY_FILE``): ``step``, ``step_time`` (since the previous boundary) and the
  metrics ``comm_wait`` (seconds with a collective in flight during the step) and
  ``compute_time`` (``step_time - comm_wait``). The first step has no time (it would count the
  start-up);
- the bytes this rank hands to collectives (the input tensors of ``all_reduce``, ``reduce``,
  ``broadcast``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``, asynchronous calls and
  DDP's comm hooks included) are counted: the metric ``comm_bytes`` per step, and
  :func:`bytes_sent` for ``aicluster.train``'s own reports;
- DDP's gradient all-reduce is compressed when the job's spec asks for it (``comm: {hook:
  powersgd | fp16 | bf16}``, passed as ``AICLUSTER_COMM_HOOK``, ``AICLUSTER_COMM_RANK`` and
  ``AICLUSTER_COMM_START_ITER``): PyTorch's own hooks, registered at the module's first
  forward unless the job registered one itself.

In synchronous data parallelism every rank's wall-clock step time is the slowest rank's; the slow
rank is the one that waits least, and ``compute_time`` says so (see
:mod:`aicluster.control.loop.health`). Nothing is written once the job uses ``aicluster.train``'s
own telemetry (``train.init``), so a step is never reported twice. Every failure here is swallowed:
timing must never break a job. Imports only the standard library (and torch, once the job has).
"""

import contextlib
import functools
import importlib.abc
import importlib.util
import json
import os
import runpy
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["StepClock", "bytes_sent", "install", "main"]

TELEMETRY_FILE = "AICLUSTER_TELEMETRY_FILE"  # aicluster.train.env.TELEMETRY_FILE
# aicluster.train.env.COMM_HOOK, COMM_RANK, COMM_START_ITER (this file imports no aicluster).
COMM_HOOK = "AICLUSTER_COMM_HOOK"
COMM_RANK = "AICLUSTER_COMM_RANK"
COMM_START_ITER = "AICLUSTER_COMM_START_ITER"
#: The module name this shim is published under once installed: it runs as ``__main__`` (a cold
#: rank) or under the zygote's name, and ``aicluster.train`` finds it there.
PUBLISHED = "_aicluster_steptime"
#: torch.distributed's collectives timed when called synchronously.
COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
)
#: Collective intervals kept per step before they are merged (a step has a few per bucket).
MAX_INTERVALS = 4096
#: Per collective counted in ``comm_bytes``: the position and keyword of the tensor this rank
#: hands in (list-of-tensors forms and objects are not counted).
PAYLOAD = {
    "all_reduce": (0, "tensor"),
    "reduce": (0, "tensor"),
    "broadcast": (0, "tensor"),
    "all_gather_into_tensor": (1, "input_tensor"),
    "reduce_scatter_tensor": (1, "input"),
}


def union_seconds(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` covered by at least one of ``intervals``."""
    covered, reach = 0.0, start
    for low, high in sorted(intervals):
        low, high = max(low, reach), min(high, end)
        if high > low:
            covered += high - low
            reach = high
    return covered


class StepClock:
    """Step boundaries and collective intervals of one rank; thread-safe (a DDP future
    completes on the backend's thread)."""

    def __init__(self, write: Callable[[dict[str, Any]], None], now: Callable[[], float]) -> None:
        self._write, self._now = write, now
        self._lock = threading.Lock()
        self._intervals: list[tuple[float, float]] = []
        self._step_began: float | None = None
        self._bytes_at_step = 0
        self.bytes = 0  # handed to collectives since the start
        self.step = 0
        self.declared = False  # a stepping record written

    def sent(self, count: int) -> None:
        with self._lock:
            self.bytes += count

    def collective(self, began: float, ended: float) -> None:
        with self._lock:
            self._intervals.append((began, ended))
            if len(self._intervals) > MAX_INTERVALS:  # merge: keep the covered time only
                low = min(b for b, _ in self._intervals)
                covered = union_seconds(self._intervals, low, ended)
                self._intervals = [(ended - covered, ended)]

    def declare(self) -> None:
        """The job created an optimizer: say once that this rank will step."""
        with self._lock:
            if self.declared:
                return
            self.declared = True
        self._write({"kind": "stepping"})

    def boundary(self) -> dict[str, Any]:
        """End the current step: the record written for it."""
        now = self._now()
        with self._lock:
            began, self._step_began = self._step_began, now
            intervals, self._intervals = self._intervals, []
            sent, self._bytes_at_step = self.bytes - self._bytes_at_step, self.bytes
            self.step += 1
            record: dict[str, Any] = {"kind": "step", "step": self.step}
            if began is not None:
                took = now - began
                wait = min(took, union_seconds(intervals, began, now))
                record["step_time"] = took
                record["metrics"] = {
                    "compute_time": took - wait,
                    "comm_wait": wait,
                    "comm_bytes": float(sent),
                }
        self._write(record)
        return record


class _Telemetry:
    """Appends records to the rank's telemetry file, in :class:`aicluster.train.StepRecord`'s
    format; silent while ``aicluster.train`` reports for the job."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file: Any = None
        self.rank = _int(os.environ.get("RANK"))
        self.node = os.environ.get("AICLUSTER_NODE") or None
        self.attempt = _int(os.environ.get("AICLUSTER_ATTEMPT"))

    def write(self, record: dict[str, Any]) -> None:
        session = sys.modules.get("aicluster.train.session")
        if session is not None and getattr(session, "_writer", None) is not None:
            return  # the job reports its own steps
        line = {"kind": record["kind"], "rank": self.rank, "time": time.time()}
        line.update(record)
        if self.node is not None:
            line["node"] = self.node
        if self.attempt is not None:
            line["attempt"] = self.attempt
        try:
            if self.file is None:
                self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - job-long
            self.file.write(json.dumps(line, separators=(",", ":")) + "\n")
            self.file.flush()
        except (OSError, ValueError):
            pass  # a full disk or a closed file: timing is best effort


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


_clock: StepClock | None = None
_lead: Any = None  # weak reference to the optimizer whose steps are the job's steps
_local = threading.local()  # depth of nested timed collectives (all_gather_object -> all_gather)


def _on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    global _lead
    if _clock is None:
        return
    lead = _lead() if _lead is not None else None
    if lead is None:  # the first optimizer (or a new one, once the first is gone)
        _lead, lead = weakref.ref(optimizer), optimizer
    if lead is optimizer:
        with contextlib.suppress(Exception):
            _clock.boundary()


def bytes_sent() -> int:
    """Bytes this rank has handed to collectives since the shim was installed (0 before)."""
    return _clock.bytes if _clock is not None else 0


def _payload_bytes(name: str, args: Any, kwargs: Any) -> int:
    where = PAYLOAD.get(name)
    if where is None:
        return 0
    position, keyword = where
    tensor = args[position] if len(args) > position else kwargs.get(keyword)
    try:
        return int(tensor.numel()) * int(tensor.element_size())
    except Exception:  # not a tensor: torch itself will say so
        return 0


def _timed(function: Callable[..., Any], name: str = "") -> Callable[..., Any]:
    """``function`` (the torch.distributed collective ``name``) with its payload counted and its
    synchronous calls timed."""

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if _clock is not None and name in PAYLOAD:
            _clock.sent(_payload_bytes(name, args, kwargs))
        depth = getattr(_local, "depth", 0)
        if _clock is None or depth or kwargs.get("async_op"):
            return function(*args, **kwargs)
        _local.depth = depth + 1
        began = time.monotonic()
        try:
            return function(*args, **kwargs)
        finally:
            _local.depth = depth
            _clock.collective(began, time.monotonic())

    timed.__aicluster_timed__ = True  # type: ignore[attr-defined]
    return timed


def _timed_hook(hook: Callable[..., Any]) -> Callable[..., Any]:
    """A DDP comm hook whose future's time in flight counts as collective wait."""

    # Unannotated: DDP refuses a hook whose ``bucket`` annotation is not ``dist.GradBucket``.
    def timed(state, bucket):  # type: ignore[no-untyped-def]
        began = time.monotonic()
        future = hook(state, bucket)

        def done(finished: Any) -> Any:
            if _clock is not None:
                _clock.collective(began, time.monotonic())
            return finished.value()

        return future.then(done)

    return timed


def _configured_hook(process_group: Any) -> tuple[Any, Callable[..., Any]]:
    """The state and comm hook the job's spec asks for (``AICLUSTER_COMM_HOOK``): PowerSGD with
    ``AICLUSTER_COMM_RANK`` (default 2) from iteration ``AICLUSTER_COMM_START_ITER`` (default
    2, the earliest PyTorch allows), fp16 or bf16 compression, else the plain all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    name = os.environ.get(COMM_HOOK, "")
    if name == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        state = powerSGD_hook.PowerSGDState(
            process_group=process_group,
            matrix_approximation_rank=_int(os.environ.get(COMM_RANK)) or 2,
            start_powerSGD_iter=max(2, _int(os.environ.get(COMM_START_ITER)) or 2),
        )
        return state, powerSGD_hook.powerSGD_hook
    if name == "fp16":
        return process_group, default_hooks.fp16_compress_hook
    if name == "bf16":
        return process_group, default_hooks.bf16_compress_hook
    if name:
        print(f"aicluster: unknown comm hook {name!r}; plain all-reduce", file=sys.stderr)
    return process_group, default_hooks.allreduce_hook


def _patch_ddp(ddp_class: Any) -> None:
    """Time DDP's gradient all-reduce: the job's own comm hook wrapped when it registers one,
    else the default all-reduce registered (timed) at the module's first forward."""
    register, builtin, forward = (
        ddp_class.register_comm_hook,
        ddp_class._register_builtin_comm_hook,
        ddp_class.forward,
    )

    def register_comm_hook(self: Any, state: Any, hook: Callable[..., Any]) -> Any:
        self._aicluster_hooked = True
        if not callable(hook):
            return register(self, state, hook)  # DDP says what is wrong with it
        return register(self, state, functools.wraps(hook)(_timed_hook(hook)))

    def register_builtin(self: Any, comm_hook_type: Any) -> Any:
        self._aicluster_hooked = True  # a C++ hook: not timed
        return builtin(self, comm_hook_type)

    @functools.wraps(forward)
    def timed_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_aicluster_hooked", True):
            self._aicluster_hooked = True
            try:
                state, hook = _configured_hook(self.process_group)
                register(self, state, _timed_hook(hook))
            except Exception as error:  # DDP's own all-reduce then runs, untimed
                print(f"aicluster: comm hook not set ({error})", file=sys.stderr)
        return forward(self, *args, **kwargs)

    original_init = ddp_class.__init__

    @functools.wraps(original_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if "_aicluster_hooked" not in self.__dict__:  # not set by a hook registered in init
            self._aicluster_hooked = False

    ddp_class.register_comm_hook = functools.wraps(register)(register_comm_hook)
    ddp_class._register_builtin_comm_hook = functools.wraps(builtin)(register_builtin)
    ddp_class.forward = timed_forward
    ddp_class.__init__ = init


def _publish() -> None:
    """Put :func:`bytes_sent` where ``aicluster.train`` looks (``sys.modules[PUBLISHED]``): this
    file runs as a cold rank's ``__main__`` (until the job's script takes that name) or is loaded
    from its path by the warm process, under no importable name either way."""
    published = types.ModuleType(PUBLISHED)
    published.bytes_sent = bytes_sent  # type: ignore[attr-defined]
    sys.modules.setdefault(PUBLISHED, published)


def _patch_optimizer(optimizer_class: Any) -> None:
    """Say the rank will step (:meth:`StepClock.declare`) once an optimizer is made."""
    original = optimizer_class.__init__

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if _clock is not None:
            with contextlib.suppress(Exception):
                _clock.declare()

    optimizer_class.__init__ = init


def _install_torch(torch: Any) -> None:
    """Hooks into an imported torch (once per process)."""
    global _clock
    if _clock is not None or getattr(torch, "__aicluster_steptime__", False):
        return
    path = os.environ.get(TELEMETRY_FILE)
    if not path:
        return
    torch.__aicluster_steptime__ = True
    _clock = StepClock(_Telemetry(path).write, time.monotonic)
    _publish()
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_on_optimizer_step)
    _patch_optimizer(torch.optim.Optimizer)
    import torch.distributed as dist

    if not dist.is_available():
        return
    for name in COLLECTIVES:
        function = getattr(dist, name, None)
        if callable(function) and not getattr(function, "__aicluster_timed__", False):
            setattr(dist, name, _timed(function, name))
    from torch.nn.parallel import DistributedDataParallel

    _patch_ddp(DistributedDataParallel)


def _safely_install(torch: Any) -> None:
    try:
        _install_torch(torch)
    except Exception as error:  # an unexpected torch: run untimed, say why once
        print(f"aicluster: step timing off ({type(error).__name__}: {error})", file=sys.stderr)


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Runs :func:`_safely_install` right after ``import torch`` completes."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # by the finders after this one
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_install(module: Any) -> None:
            exec_module(module)
            _safely_install(module)

        loader.exec_module = exec_then_install  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Time steps in this process: at once if torch is imported, else right after its import.
    A no-op outside the runtime (no telemetry file)."""
    if not os.environ.get(TELEMETRY_FILE):
        return
    torch = sys.modules.get("torch")
    if torch is not None:
        _safely_install(torch)
    elif not any(isinstance(finder, _AfterTorch) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())


def _launcher_frame(filename: str) -> bool:
    """A frame of what starts the job's code (this shim, the warm process, runpy), not of it."""
    name = os.path.basename(filename)
    return name in ("_steptime.py", "_zygote.py") or "runpy" in name


def run_job_code(run: Callable[[], object]) -> None:
    """``run()`` the job's code. An exception it raises is printed as ``python SCRIPT`` prints
    it, through ``sys.excepthook`` (the job may have set its own), from the job's first frame:
    the launcher's own frames (this shim, the warm process, runpy) are noise in the traceback a
    user reads first (``aicluster why``), and the exit code is Python's, 1."""
    try:
        run()
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as error:
        trace = error.__traceback__
        while trace is not None and _launcher_frame(trace.tb_frame.f_code.co_filename):
            trace = trace.tb_next
        if trace is not None:  # Python prints the exception's own traceback, not the argument
            error.__traceback__ = trace
        sys.excepthook(type(error), error, error.__traceback__)
        sys.stderr.flush()
        raise SystemExit(1) from None


def main() -> None:
    """``_steptime.py SCRIPT ARGS`` / ``_steptime.py -m MODULE ARGS``: install, then run the
    job as ``python SCRIPT ARGS`` / ``python -m MODULE ARGS`` would."""
    argv = sys.argv[1:]
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        raise SystemExit("usage: _steptime.py SCRIPT ARGS | -m MODULE ARGS")
    install()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's path in argv[0]
        sys.path[0] = os.getcwd()
        run_job_code(lambda: runpy.run_module(argv[1], run_name="__main__", alter_sys=True))
        return
    script = argv[0]
    if not os.path.exists(script):  # as python says it
        path = os.path.abspath(script)
        print(
            f"{sys.executable}: can't open file {path!r}: [Errno 2] No such file or directory",
            file=sys.stderr,
        )
        raise SystemExit(2)
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    run_job_code(lambda: runpy.run_path(script, run_name="__main__"))


if __name__ == "__main__":
    main()
