"""The executor: a plan's steps compiled to straight-line Python.

As ``torch.fx`` does for its graphs, a :class:`Plan` becomes the source of one Python
function, one line per step over local variables, a ``del`` after each value's last
use, compiled and registered with :mod:`linecache` so that a traceback through a run
shows the generated line::

    def run(feeds, outer=None, ctx=None):
        ...
        try:
            v2 = feeds.get('x')
            v3 = d0(v2)                      # Neg: the kernel's direct call, np.negative
            del v2
            if type(v4 := f1(k1, v3)) is not nd: v4 = first(v4)   # a function kernel
            del v3
            v5 = k2(v4, c4)[0]               # a class kernel: its run, outputs in a tuple
            del v4
            return [v5]
        except BaseException as e:
            ...                              # the step of e's line: wrap_error(e, step)

A step calls what it can call most directly: a kernel's
:meth:`~onnxrt.plugin.kernel.Kernel.direct_call` where the kernel offers one, a function
kernel's function itself (its result made an array only where it is not one already),
a class kernel's bound ``run``. A failing step is found from the traceback's line
number and its error wrapped as the run loop always did: naming the node, op and
provider (:func:`wrap_error`). Around the steps a run sets the allocation cap kernels
read (:mod:`onnxrt.run.limits`), numpy's error state (all ignored: inf and NaN as the
ops define, never a warning) and the devices' run scopes.

The code is generated on a plan's first run (or when :attr:`Plan.code` is read), from
the steps as they are then. Runs with ``RunOptions`` or a profiler take a second
variant with the checks inlined (termination before each step, a profile event after
it) over every step, shape computations included. All state of a run is in the
function's locals, so any number of threads may run one plan at once.
"""

from __future__ import annotations

import itertools
import keyword
import linecache
import logging
import threading
import time
import weakref
from contextlib import ExitStack
from typing import Any, Callable

import numpy as np

from ..errors import Fail, InvalidArgument, OnnxRtError, RuntimeException
from ..plugin.kernel import FunctionKernel, Kernel
from ..run.limits import _limit

__all__ = ["Plan", "RunContext", "compile_steps", "wrap_error"]

logger = logging.getLogger("onnxrt")

_NONE_SLOT = 0  # always holds None: absent optional inputs read it
_DISCARD_SLOT = 1  # unused optional outputs are written here and dropped

#: distinguishes the file names the generated sources are registered under
_serial = itertools.count()


class RunContext:
    """Per-run settings the checked variant of a run consults: termination and profiling."""

    __slots__ = ("run_options", "profiler")

    def __init__(self, run_options=None, profiler=None):
        self.run_options = run_options
        self.profiler = profiler


def wrap_error(e: BaseException, step) -> BaseException:
    """The error a run raises for ``e`` raised by ``step``: typed, and naming the node,
    op and provider (interrupts, ``RuntimeException`` and errors that already name the
    node pass as they are)."""
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        return e
    if isinstance(e, RuntimeException):
        return e
    what = "copying a value between devices" if step.is_copy else f"running {step.op_type} node {step.node_name!r}"
    if isinstance(e, MemoryError):
        return Fail(f"out of memory {what} on {step.provider}: {e}")
    if isinstance(e, OnnxRtError) and f"node {step.node_name!r}" in str(e):
        return e
    msg = f"{what} on {step.provider}: {type(e).__name__}: {e}"
    if isinstance(e, (InvalidArgument, IndexError)):
        # out-of-range indices come from the feed: onnxruntime's INVALID_ARGUMENT
        return InvalidArgument(msg)
    return Fail(msg)


def _terminated(step) -> RuntimeException:
    return RuntimeException(f"the run was terminated (RunOptions.terminate) before node {step.node_name!r}")


def _fit(r, n: int) -> tuple:
    """A class kernel's outputs ``r`` as exactly ``n`` values: missing ones are None,
    extra ones dropped (as the values of a node's absent trailing outputs)."""
    r = tuple(r)
    if len(r) == n:
        return r
    return (r + (None,) * n)[:n]


def _quiet_error_state() -> tuple | None:
    """``(context variable, value)``: what ``np.errstate(all="ignore")`` sets, for a run to
    set and reset directly (a fifth of the cost of entering an ``errstate`` each run);
    None where this numpy keeps its error state otherwise."""
    try:
        from numpy._core._ufunc_config import _extobj_contextvar as var
    except ImportError:  # pragma: no cover - numpy 1.x
        return None
    with np.errstate(all="ignore"):
        value = var.get()
    return var, value


_QUIET = _quiet_error_state()


def _entered(devices) -> ExitStack:
    """The ``run_scope()`` of each of ``devices``, entered (those already entered are
    left again if a later one fails)."""
    with ExitStack() as stack:
        for dev in devices:
            stack.enter_context(dev.run_scope())
        return stack.pop_all()


class _Source:
    """Lines of generated source, the objects they name, and which step each line runs."""

    def __init__(self):
        self.lines: list[str] = []
        self.ns: dict[str, Any] = {"nd": np.ndarray}
        self.line_step: dict[int, Any] = {}

    def bind(self, name: str, value: Any) -> str:
        """Make ``value`` a global of the generated code under ``name``."""
        self.ns[name] = value
        return name

    def emit(self, text: str, step=None) -> None:
        self.lines.append(text)
        if step is not None:
            self.line_step[len(self.lines)] = step

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _literal_kwargs(src: _Source, prefix: str, kwargs: dict) -> str:
    """``, a=g1, b=g2`` for ``kwargs`` (their values made globals), or ``, **g`` where a
    key is not an identifier."""
    if not kwargs:
        return ""
    if all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k in kwargs):
        parts = []
        for j, (k, v) in enumerate(kwargs.items()):
            parts.append(f"{k}=..." if v is Ellipsis else f"{k}={src.bind(f'{prefix}_{j}', v)}")
        return ", " + ", ".join(parts)
    return f", **{src.bind(prefix, dict(kwargs))}"


def _takes_ctx(fn) -> bool:
    """Whether a kernel's run takes the run's context (the control-flow kernels do)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "ctx" in params and "outer" in params


def _call(src: _Source, i: int, step, args: list[str]) -> tuple[str, str]:
    """How step ``i`` is called: ``(kind, expression)``, where the expression's value is
    the step's only output (``"value"``), a sequence of its outputs (``"seq"``) or a
    function kernel's raw result (``"function"``)."""
    fn = step.fn
    kernel = getattr(fn, "__self__", None)
    n_out = len(step.outs)
    if step.implicit or (kernel is not None and _takes_ctx(fn)):
        # control flow: the bound run, with the outer-scope values and the run's context
        # (a body that reads nothing from outside still needs the context: a Loop checks
        # RunOptions.terminate between its iterations)
        outer = ", ".join(f"{n!r}: {a}" for n, a in zip([n for n, _ in step.implicit], args[len(step.ins):]))
        call_args = ", ".join(args[: len(step.ins)] + [f"outer={{{outer}}}", "ctx=ctx"])
        return "seq", f"{src.bind(f'k{i}', fn)}({call_args})"
    value_fn = getattr(fn, "value_fn", None)
    if value_fn is not None:  # a copy step: one value in, one out
        return "value", f"{src.bind(f'cp{i}', value_fn)}({', '.join(args)})"
    if isinstance(kernel, Kernel) and getattr(fn, "__func__", None) is type(kernel).run:
        direct = _direct_call(kernel, step) if n_out == 1 else None
        if direct is not None:
            picked = args if direct.inputs is None else [args[p] if p < len(args) else "None" for p in direct.inputs]
            extra = [src.bind(f"a{i}_{j}", a) for j, a in enumerate(direct.args)]
            kw = _literal_kwargs(src, f"w{i}", dict(direct.kwargs))
            return "value", f"{src.bind(f'd{i}', direct.fn)}({', '.join(picked + extra)}{kw})"
        if type(kernel).run is FunctionKernel.run:
            f = src.bind(f"f{i}", type(kernel).fn)
            k = src.bind(f"k{i}", kernel)
            kw = _literal_kwargs(src, f"w{i}", kernel.kw)
            return "function", f"{f}({', '.join([k] + args)}{kw})"
    return "seq", f"{src.bind(f'k{i}', fn)}({', '.join(args)})"


def _direct_call(kernel: Kernel, step):
    """The kernel's :class:`~onnxrt.plugin.kernel.DirectCall`, or None; a kernel whose
    ``direct_call`` fails runs as it would without one (the failure is logged)."""
    try:
        return kernel.direct_call()
    except Exception as e:  # noqa: BLE001 - only a shortcut is lost
        logger.warning("%s node %r: direct_call failed (%s: %s); the step calls run",
                       step.op_type, step.node_name, type(e).__name__, e)
        return None


def _emit_call(src: _Source, i: int, step, args: list[str], targets: list[str], pad: str) -> None:
    """The line(s) running step ``i`` and assigning its outputs to ``targets``."""
    kind, expr = _call(src, i, step, args)
    n = len(targets)
    if n == 0:
        src.emit(f"{pad}{expr}", step)
    elif kind == "value":
        src.emit(f"{pad}{targets[0]} = {expr}", step)
    elif kind == "function":
        if n == 1:
            t = targets[0]
            first = src.bind("first", FunctionKernel.first_output)
            src.emit(f"{pad}if type({t} := {expr}) is not nd: {t} = {first}({t})", step)
        else:
            many = src.bind("outputs", FunctionKernel.outputs)
            src.emit(f"{pad}{', '.join(targets)} = {many}({expr}, {n})", step)
    elif n == 1:
        src.emit(f"{pad}{targets[0]} = {expr}[0]", step)
    else:
        fit = src.bind("fit", _fit)
        src.emit(f"{pad}{', '.join(targets)} = {fit}({expr}, {n})", step)


class _Names:
    """The expression each slot reads as while the code is generated: a local while its
    value is live, a global for a constant, ``None`` for an empty slot (as a slot list
    held before the first write and after the last use)."""

    def __init__(self, src: _Source, constants: dict[int, Any]):
        self.src = src
        self.constants = constants
        self.live: set[int] = set()

    @staticmethod
    def local(slot: int) -> str:
        return "_" if slot == _DISCARD_SLOT else f"v{slot}"

    def read(self, slot: int) -> str:
        if slot in self.live:
            return self.local(slot)
        if slot == _NONE_SLOT:
            return "None"
        if slot in self.constants:
            return self.src.bind(f"c{slot}", self.constants[slot])
        return "None"

    def write(self, slot: int) -> str:
        self.live.add(slot)
        return self.local(slot)

    def free(self, slots) -> list[str]:
        names = []
        for s in slots:
            if s in self.live:
                self.live.discard(s)
                names.append(self.local(s))
        return names


def _emit_steps(src: _Source, names: _Names, steps, frees, pad: str, checked: bool) -> None:
    for i, (step, free) in enumerate(zip(steps, frees)):
        args = [names.read(s) for s in step.ins] + [names.read(s) for _, s in step.implicit]
        if checked:
            st = src.bind(f"s{i}", step)
            src.emit(f"{pad}if ro is not None and ro.terminate: raise terminated({st})", step)
            src.emit(f"{pad}if prof is not None: t0 = clock()", step)
        targets = [names.write(s) for s in step.outs]
        _emit_call(src, i, step, args, targets, pad)
        if checked:
            src.emit(f"{pad}if prof is not None: prof.node_event({st}, t0, clock(), [{', '.join(targets)}])", step)
        dead = names.free(list(free) + ([_DISCARD_SLOT] if _DISCARD_SLOT in step.outs else []))
        if dead:
            src.emit(f"{pad}del {', '.join(dead)}", step)


def _emit_handler(src: _Source, pad: str) -> None:
    """The ``except`` clause wrapping a failed step's error (see :func:`wrap_error`)."""
    src.emit(f"{pad}except BaseException as e:")
    src.emit(f"{pad}    st = step_at(e)")
    src.emit(f"{pad}    w = e if st is None else wrap(e, st)")
    src.emit(f"{pad}    if w is e: raise")
    src.emit(f"{pad}    raise w from e")


class _SourceLoader:
    """The ``__loader__`` of generated code: :mod:`linecache` asks it for the source
    again if its cache was cleared."""

    def __init__(self, text: str):
        self.text = text

    def get_source(self, name: str) -> str:
        return self.text


def _finish(src: _Source, name: str, label: str) -> Callable:
    """Compile ``src``, register it with :mod:`linecache` and return function ``name``."""
    # not "<...>" alone: linecache reloads only other names through the loader
    filename = f"<onnxrt {label} #{next(_serial)}>.py"
    text = src.text()
    src.ns.update(wrap=wrap_error, terminated=_terminated, clock=time.perf_counter_ns,
                  __name__=filename, __loader__=_SourceLoader(text))
    exec(compile(text, filename, "exec"), src.ns)  # noqa: S102 - our own generated source
    fn = src.ns[name]
    code, line_step = fn.__code__, src.line_step

    def step_at(e: BaseException):
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code is not code:
            tb = tb.tb_next
        return None if tb is None else line_step.get(tb.tb_lineno)

    src.ns["step_at"] = step_at
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    # the source lives as long as the function
    weakref.finalize(fn, linecache.cache.pop, filename, None)
    fn.__onnxrt_source__ = text
    return fn


def compile_steps(steps, ins: tuple[int, ...], outs: tuple[int, ...], constants: dict[int, Any],
                  label: str = "steps") -> Callable:
    """A function of the values of slots ``ins`` that runs ``steps`` and returns the
    tuple of the values of slots ``outs`` (a shape segment's body: no error state or
    allocation cap of its own; it runs inside a plan's run). Each value is dropped after
    its last use among ``steps``."""
    src = _Source()
    names = _Names(src, constants)
    params = [names.write(s) for s in ins]
    keep = set(outs) | set(constants) | {_NONE_SLOT}
    src.emit(f"def segment({', '.join(params)}):")
    src.emit("    try:")
    _emit_steps(src, names, steps, _last_uses(steps, keep), "        ", checked=False)
    result = [names.read(s) for s in outs]
    src.emit(f"        return ({', '.join(result)}{',' if len(result) == 1 else ''})")
    _emit_handler(src, "    ")
    return _finish(src, "segment", label)


def _last_uses(steps, keep: set[int]) -> list[tuple[int, ...]]:
    """For each step, the slots last read (or written and never read) there."""
    last: dict[int, int] = {}
    for idx, st in enumerate(steps):
        for s in list(st.ins) + [s for _, s in st.implicit] + list(st.outs):
            last[s] = idx
    frees: list[list[int]] = [[] for _ in steps]
    for s, idx in last.items():
        if s not in keep:
            frees[idx].append(s)
    return [tuple(sorted(f)) for f in frees]


class Plan:
    """An immutable list of steps over integer slots, run as generated Python.

    :ivar steps: every step, in order (what profiled and checked runs execute).
    :ivar fast_steps: :attr:`steps` with shape computations memoized
        (:mod:`onnxrt.plan.shape_memo`): what an ordinary run executes.
    :ivar input_slots: input name -> slot; :ivar outer_slots: outer-scope name -> slot
        (a subgraph's); :ivar output_slots: the slots a run returns, in order.
    :ivar scopes: the devices whose ``run_scope()`` is entered around each run.

    ``plan.run(feeds, outer, ctx)`` runs it; :attr:`code` is the source of a run.
    """

    def __init__(
        self,
        steps: list,
        n_slots: int,
        input_slots: dict[str, int],
        outer_slots: dict[str, int],
        output_slots: list[int],
        constants: dict[int, Any],
        max_bytes: int,
        fast_steps: list | None = None,
        scopes: tuple = (),
    ):
        self.steps = tuple(steps)
        self.scopes = tuple(scopes)
        self.fast_steps = tuple(fast_steps) if fast_steps is not None else self.steps
        self.n_slots = n_slots
        self.input_slots = dict(input_slots)
        self.outer_slots = dict(outer_slots)
        self.output_slots = tuple(output_slots)
        self.constants = dict(constants)
        template: list[Any] = [None] * n_slots
        for s, v in constants.items():
            template[s] = v
        self._template = template
        self._const_slots = frozenset(constants)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._fns: dict[bool, Callable] = {}

    def run(self, feeds: dict[str, Any], outer: dict[str, Any] | None = None, ctx: RunContext | None = None) -> list:
        """Run with ``feeds`` (input name -> value) and ``outer`` (outer-scope name ->
        value, for a subgraph) and return the outputs in order. ``ctx`` carries the
        ``RunOptions`` and the profiler, if any.

        The first run generates the code; afterwards ``plan.run`` is the generated
        function itself."""
        return self._function(False)(feeds, outer, ctx)

    @property
    def code(self) -> str:
        """The generated source of an ordinary run (memoized shape computations, no checks)."""
        return self._function(False).__onnxrt_source__

    @property
    def checked_code(self) -> str:
        """The generated source of a run with ``RunOptions`` or profiling: every step,
        each preceded by the termination check and followed by its profile event."""
        return self._function(True).__onnxrt_source__

    def _function(self, checked: bool) -> Callable:
        fn = self._fns.get(checked)
        if fn is None:
            with self._lock:
                fn = self._fns.get(checked)
                if fn is None:
                    fn = self._fns[checked] = self._generate(checked)
                    if not checked:
                        # later runs call the generated function with no method between
                        self.run = fn
        return fn

    def _checked_run(self, feeds, outer, ctx):
        return self._function(True)(feeds, outer, ctx)

    def _generate(self, checked: bool) -> Callable:
        src = _Source()
        names = _Names(src, self.constants)
        steps = self.steps if checked else self.fast_steps
        name = "run_checked" if checked else "run"
        src.emit(f"def {name}(feeds, outer=None, ctx=None):")
        if checked:
            src.emit("    ro = ctx.run_options")
            src.emit("    prof = ctx.profiler")
        else:
            src.bind("checked", self._checked_run)
            src.emit("    if ctx is not None and (ctx.run_options is not None or ctx.profiler is not None):")
            src.emit("        return checked(feeds, outer, ctx)")
        # kernels read the cap through onnxrt.run.limits.check_allocation
        src.ns.update(limit=_limit, errstate=np.errstate)
        src.emit(f"    token = limit.set({self.max_bytes}) if limit.get() != {self.max_bytes} else None")
        # Floating-point overflow, division by zero and invalid operations give inf and
        # NaN as the ONNX ops define, never a warning: one numpy error state per run (it
        # is per thread) spares every elementwise kernel its own.
        contexts = []
        if _QUIET is not None:
            src.ns.update(errvar=_QUIET[0], quiet=_QUIET[1])
            # a body's plan runs inside its parent's run, where the state is set already
            src.emit("    errtoken = errvar.set(quiet) if errvar.get() is not quiet else None")
        else:
            contexts.append("errstate(all='ignore')")
        if self.scopes:
            src.ns.update(entered=_entered, scopes=self.scopes)
            contexts.append("entered(scopes)")
        src.emit("    try:")
        pad = "        "
        if contexts:
            src.emit(f"        with {', '.join(contexts)}:")
            pad = "            "
        for input_name, slot in self.input_slots.items():
            default = f", {names.read(slot)}" if slot in self.constants else ""
            src.emit(f"{pad}{names.write(slot)} = feeds.get({input_name!r}{default})")
        if self.outer_slots:
            outer_vars = [names.write(s) for s in self.outer_slots.values()]
            src.emit(f"{pad}if outer:")
            for var, outer_name in zip(outer_vars, self.outer_slots):
                src.emit(f"{pad}    {var} = outer[{outer_name!r}]")
            src.emit(f"{pad}else:")
            src.emit(f"{pad}    {' = '.join(outer_vars)} = None")
        _emit_steps(src, names, steps, [st.free for st in steps], pad, checked)
        src.emit(f"{pad}return [{', '.join(names.read(s) for s in self.output_slots)}]")
        _emit_handler(src, "    ")
        src.emit("    finally:")
        if _QUIET is not None:
            src.emit("        if errtoken is not None:")
            src.emit("            errvar.reset(errtoken)")
        src.emit("        if token is not None:")
        src.emit("            limit.reset(token)")
        return _finish(src, name, "plan" + (" checked" if checked else ""))

    def __repr__(self) -> str:
        return f"<Plan of {len(self.steps)} steps ({len(self.fast_steps)} a run), {len(self.output_slots)} outputs>"
