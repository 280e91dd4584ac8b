r"""The operator interface: a head is a function ``f(P)`` of its attention matrix.

Every operator of the family is (or is approximated by) a polynomial in ``P``,

.. math::
    f(P) v = \sum_{k=0}^{K} c_k P^k v,

so an operator is a small module whose :meth:`DiffusionOperator.coefficients` returns the
weights ``c`` (one row per head of the group it serves, differentiable in its learned
parameters); the engine in :mod:`diffusionformer.ops` does the propagation. Operators that
are not polynomials in one ``P`` (the exact ``matrix_exp`` reference) set
``is_polynomial = False`` and implement :meth:`DiffusionOperator.apply_matrix` instead.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from typing import Any, ClassVar, Iterator

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import unset_fake_temporarily

from diffusionformer.config import _check_flag
from diffusionformer.ops._checks import checks_values
from diffusionformer.ops.dense import MatrixBackend
from diffusionformer.ops.engine import all_heads, polynomial, work_dtype

try:  # _Pow.apply: torch's Function.apply without its per-call inspect.signature (private pieces of torch)
    from torch._functorch.utils import unwrap_dead_wrappers as _unwrap_dead_wrappers
    _FUNCTORCH_ACTIVE = torch._C._are_functorch_transforms_active
except (ImportError, AttributeError):  # pragma: no cover - a torch release without them: torch's own apply
    _FUNCTORCH_ACTIVE = None
#: the torch.func transforms running, innermost last (None where torch lacks it); _powers counts their jvp levels
_INTERPRETERS = getattr(getattr(torch._C, "_functorch", None), "get_interpreter_stack", None)

__all__ = ["DiffusionOperator"]


def _spec_text(name: str, kwargs: dict[str, Any]) -> str:
    """``name(key=value, ...)``, each value as ``repr`` writes it, in ``kwargs``' order (the bare ``name`` without
    arguments): how :meth:`DiffusionOperator.spec` writes an operator, and a head spec's items as the model configs
    record them (:func:`~diffusionformer.nn.heads._spec_as_read`)."""
    if not kwargs:
        return name
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")"


#: what a class may define and still add no behaviour to its parent: a docstring, pickling and copy hooks, its repr,
#: and a constructor (other defaults: what it builds is the parent's operator, whose spec_kwargs() write its values)
_INERT = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__firstlineno__",
                    "__static_attributes__", "__annotations__", "__getstate__", "__setstate__", "__deepcopy__",
                    "__reduce__", "__reduce_ex__", "__orig_bases__", "__parameters__", "__classcell__", "__init__",
                    "__repr__", "extra_repr"})


#: a registered class -> its own ``name`` and ``aliases`` before registering wrote them, put back when unregistered
#: (kept by the registry, which imports this module: its keys are the classes registered now)
_DECLARED: dict[type, dict[str, Any]] = {}


def _registered_class(cls: type) -> type | None:
    """The registered operator class that ``cls`` runs as: itself, or the nearest registered ancestor when every class
    in between adds no behaviour (torch's generated wrappers -- ``parametrize``'s ``ParametrizedHeatOperator``,
    FSDP's -- or a user's subclass that only sets a docstring, a repr or constructor defaults); ``None`` for a class
    never registered (a subclass that overrides anything else is another operator, whatever name it inherits or
    declares)."""
    for c in cls.__mro__:
        # registered now, not `name` in its body: a class that only declares it (never registered, or unregistered
        # since, when the name may build another class) wrote a spec that rebuilt nothing, or the other class
        if c in _DECLARED:
            return c
        if not (c.__module__.startswith("torch.") or set(c.__dict__) <= _INERT):
            return None
    return None


class DiffusionOperator(nn.Module):
    r"""Base class of all head operators (register subclasses with :func:`register_operator`).

    Subclasses set the class attributes and implement :meth:`coefficients`.

    Attributes:
        name: registry name (set by :func:`register_operator`).
        aliases: other names accepted by :func:`build_operator`.
        supports_sparse: whether the sparse (edge) back-end can run it.
        is_polynomial: whether :meth:`coefficients` describes it exactly.
        example_kwargs: constructor arguments that exercise the operator's code paths where
            the defaults hide one (learnable times, a non-identity polynomial); the
            registry-wide tests build every registered operator with them.
        num_heads: the number of heads ``G`` this instance serves (learned parameters may be
            per head); fixed operators ignore it.
        degree: the highest power ``K`` of ``P`` used (static; it fixes the cost).
        needs_second_map: the operator forms its own score maps from the head's queries and
            keys (differential attention: two softmax maps from split ``q``/``k``).
        needs_layer_state: the operator reads state that the first layer of a model leaves
            for later layers (NeuTRENO, value residuals: the first layer's values ``v0``).
        reprojects_each_step: ``P`` is recomputed from the evolving state at every step
            (nonlinear diffusion, GRAND-nl), so the steps are not powers of one linear ``P``.
        needs_uniform_map: the operator uses the uniform average over the admissible keys
            (AttnScale's direct-current part ``DC``).
        supports_kv_cache: whether :func:`~diffusionformer.nn.kv_cache.attend_cached` can serve
            it (polynomials incrementally; other functions of one causal ``P`` through
            :meth:`apply_causal_matrix`, and context operators through :meth:`apply_context`,
            both exactly by recomputation over all cached tokens). Every registered operator
            does; an operator whose row ``i`` could depend on tokens after ``i`` on a causal
            graph (it reads tokens other than through the context's causal graph) sets it to
            ``False`` and is refused by cached decoding.

    Operators that declare any of the last four are "context" operators
    (:attr:`uses_context`): the layer hands them a
    :class:`~diffusionformer.ops.rivals.RivalContext` (their heads' ``q``, ``k``, ``v``, the
    mask or edges, a back-end-agnostic ``attend``/``uniform`` and the layer state) and calls
    :meth:`apply_context`; they set ``is_polynomial = False``.

    Shapes:
        :meth:`coefficients`: ``(K+1,)`` shared by the ``G`` heads, or ``(G, K+1)``.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    supports_sparse: ClassVar[bool] = True
    is_polynomial: ClassVar[bool] = True
    needs_second_map: ClassVar[bool] = False
    needs_layer_state: ClassVar[bool] = False
    reprojects_each_step: ClassVar[bool] = False
    needs_uniform_map: ClassVar[bool] = False
    supports_kv_cache: ClassVar[bool] = True
    example_kwargs: ClassVar[dict[str, Any]] = {}
    #: the layer hands :meth:`apply_matrix` ``P`` in float32 for half inputs (an operator that computes in float32:
    #: the gradient of ``P`` may overflow float16), else in the input dtype
    _takes_float32_P: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The layers' fast paths trust static_coefficients() without calling coefficients(). A subclass that
        # redefines coefficients() alone (a LaplacianOperator returning other weights) kept its parent's constants
        # there, so the layer ran the parent's operator while coefficients() named another: such a class is
        # treated as having no fixed coefficients (correct, via coefficients(), at the cost of the fast path)
        # unless it defines static_coefficients() too.
        # Likewise the causal hook: a subclass of ppr-exact that redefines apply_matrix() alone kept its parent's
        # triangular solve in apply_causal_matrix(), which causal layers and cached decoding call instead, so a
        # causal call ran the parent's f(P) and a non-causal one the subclass's. Such a class gets the default
        # (apply_matrix() on the lower-triangular P) unless it defines apply_causal_matrix() too.
        # "Redefines" as the MRO resolves it: a mixin listed before the parent that supplies coefficients() (class
        # Op(TwoMixin, LaplacianOperator)) overrides it as much as the class's own body does.
        mro = cls.__mro__
        for method, hook in (("coefficients", "static_coefficients"), ("apply_matrix", "apply_causal_matrix")):
            owner = next(c for c in mro if method in c.__dict__)
            hook_owner = next(c for c in mro if hook in c.__dict__)
            if mro.index(owner) < mro.index(hook_owner) and hook_owner is not DiffusionOperator:
                setattr(cls, hook, DiffusionOperator.__dict__[hook])

    def __init__(self, num_heads: int = 1) -> None:
        super().__init__()
        if not isinstance(num_heads, numbers.Integral) or isinstance(num_heads, bool) or num_heads < 1:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        self.num_heads = int(num_heads)

    @property
    def degree(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must define `degree`")

    def coefficients(self) -> Tensor:  # pragma: no cover - abstract
        """Weights on ``P^0 .. P^K``: ``(K+1,)`` or ``(G, K+1)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement coefficients()")

    def __dir__(self) -> list[str]:
        # a non-polynomial operator has no degree: its ``degree`` raises NotImplementedError, which ``hasattr`` does
        # not catch, and torch.jit.trace asks hasattr of every name dir() lists on every submodule (torch's
        # module_has_exports): tracing any layer or model holding one failed there; the name is not listed
        names = super().__dir__()
        return names if self.is_polynomial else [n for n in names if n != "degree"]

    def spec_kwargs(self) -> dict:
        """Constructor arguments (besides ``num_heads``) that rebuild this operator's architecture.

        Subclasses with arguments override this; learned values live in the state dict.
        """
        return {}

    def spec(self) -> str:
        """A spec string that :func:`~diffusionformer.operators.build_operator` turns back into
        an equivalent operator, e.g. ``"heat(t=0.5, steps=4, method='taylor', learnable=True)"``.

        Only a registered class has one: an instance of a class never registered (a subclass of a
        registered operator that overrides anything, though it inherits its parent's ``name``, or a class
        that declares a ``name`` but is not, or no longer, registered under it) writes
        ``<unregistered module.Class>``, which names it but rebuilds nothing (register it to get a spec);
        a subclass that adds no behaviour (``torch.nn.utils.parametrize``'s generated class, one that only
        sets a docstring, its repr or other constructor defaults) writes its registered parent's spec.
        """
        if _registered_class(type(self)) is not None:
            return _spec_text(self.name, self.spec_kwargs())
        # the parent's name (or '' for a direct subclass) made the layer's heads_spec() and a checkpoint's model
        # record read "laplacian:1" (or ":1") for a head that runs another operator: a resume with the parent's
        # operator was accepted as the same model
        cls = type(self)
        return _spec_text(f"<unregistered {cls.__module__}.{cls.__qualname__}>", self.spec_kwargs())

    def reset_parameters(self) -> None:
        """Set the learned parameters back to the values the constructor gave them, in place (as
        :meth:`torch.nn.Linear.reset_parameters`): the learned operators define it; an operator without
        parameters has nothing to reset, and one with parameters that does not define it is refused.
        """
        self._check_resettable()

    def _check_resettable(self) -> None:
        """Refuse a reset of an operator with learned parameters that does not define ``reset_parameters`` (a
        model's reset asks every part before it resets any)."""
        own = [name for name, _ in self.named_parameters()]
        if own and type(self).reset_parameters is DiffusionOperator.reset_parameters:
            raise NotImplementedError(f"{type(self).__name__} holds learned parameters {own} and does not define "
                                      "reset_parameters(); define it to re-initialise them")

    def static_coefficients(self) -> tuple[float, ...] | None:
        """The coefficients as Python floats when they are fixed constants, else ``None``.

        Layers use this to pick fused fast paths (e.g. all-attention heads skip the
        combination step) without a device synchronisation, so it must agree with
        :meth:`coefficients`: a subclass that overrides :meth:`coefficients` (itself or through a mixin
        listed before its parent) without overriding this method gets this ``None`` rather than its parent's
        constants.
        """
        return None

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # Fixed coefficients live in the non-persistent buffer ``_c``. Casting the module (to
        # float64, or to half precision) rebuilds them from the exact float64 values, in float64
        # or float32: half-precision coefficients would lose the operator's accuracy.
        super()._apply(fn, recurse)
        static = self.static_coefficients()
        c = getattr(self, "_c", None)
        if static is not None and isinstance(c, Tensor):
            dtype = torch.float64 if c.dtype == torch.float64 else torch.float32
            # rebuilt outside inference mode: `.to(device)` or `.float()` of a served model under
            # torch.inference_mode made it an inference tensor (torch keeps a parameter that a cast leaves
            # unchanged), and a later load_state_dict or training step refused it
            with torch.inference_mode(False):
                self._c = torch.tensor(static, dtype=dtype, device=c.device)
        self._restore_constants()  # the fixed constants too (heat-exact's t, AttnScale's omega are applied)
        return self

    def _fixed_constants(self) -> dict[str, float]:
        """``{buffer name: the constructor's value}`` of the fixed constants kept in buffers (none when learned)."""
        return {}

    def _restore_constants(self) -> None:
        """Rebuild every fixed-constant buffer from the constructor's value, in float64 or float32 (never half):
        a cast (``.half()``, ``.float()`` then ``.double()``) or a saved copy in another precision would round it."""
        for name, value in self._fixed_constants().items():
            buf = getattr(self, name, None)
            if isinstance(buf, Tensor) and buf.is_floating_point():
                dtype = torch.float64 if buf.dtype == torch.float64 else torch.float32
                with torch.inference_mode(False):  # loaded or cast under inference mode: a buffer a later load can write
                    setattr(self, name, torch.full(buf.shape, value, dtype=dtype, device=buf.device))

    def _load_from_state_dict(self, state_dict, prefix, *args):  # type: ignore[override]
        super()._load_from_state_dict(state_dict, prefix, *args)
        # a saved fixed constant equals the constructor's value in the saved precision (_check_loaded_constant):
        # keep the exact value, not the saved rounding of it
        self._restore_constants()
        # built under `with torch.device("meta")` and loaded with assign=True: the caches, on the loaded state's device
        own = [t for n, t in (*self._parameters.items(), *self._buffers.items())
               if isinstance(t, Tensor) and not t.is_meta and n not in self._non_persistent_buffers_set]
        if own:
            self._materialise_caches(own[0].device)

    def _materialise_caches(self, device: torch.device, dtype: torch.dtype | None = None) -> None:
        """Rebuild the non-persistent caches (the fixed coefficients ``_c``) on ``device`` when they are still on
        the meta device or, given the ``dtype`` of the weights they serve, in another working precision (float64
        for float64 weights, else float32).

        They are in no state dict: a module built under ``with torch.device("meta")`` and given its state by
        ``load_state_dict(..., assign=True)`` kept them on meta, and its first call failed ("Cannot copy out of
        meta tensor"); float64 weights assigned to a float32 module kept float32-rounded coefficients.
        :meth:`_apply` rebuilds them for ``to_empty`` and casts.
        """
        static = self.static_coefficients()
        c = getattr(self, "_c", None)
        if static is None or not isinstance(c, Tensor):
            return
        work = torch.float64 if (c.dtype if dtype is None else dtype) == torch.float64 else torch.float32
        if c.is_meta or c.dtype != work:
            with torch.inference_mode(False):  # as in _apply: never an inference tensor
                self._c = torch.tensor(static, dtype=work, device=device)

    def head_coefficients(self, num_heads: int | None = None) -> Tensor:
        """:meth:`coefficients` expanded to ``(G, K+1)``."""
        G = self.num_heads if num_heads is None else num_heads
        c = self.coefficients()
        if not isinstance(c, Tensor) or c.dim() not in (1, 2):
            shape = tuple(c.shape) if isinstance(c, Tensor) else type(c).__name__
            raise ValueError(f"{type(self).__name__}.coefficients() must be a tensor of shape (K+1,) or (G, K+1), "
                             f"got {shape}")
        if c.shape[-1] == 0:  # the layer would pad it to zero weights: heads that output 0
            raise ValueError(f"{type(self).__name__}.coefficients() must have at least one column (the weight on "
                             f"P^0), got shape {tuple(c.shape)}")
        if c.dtype == torch.bool or c.is_complex():  # a cast would read True as 1 or drop the imaginary part
            raise TypeError(f"{type(self).__name__}.coefficients() must be a real tensor, got {c.dtype}")
        if checks_values(c) and not torch.isfinite(c.detach()).all():  # else the engine's "coeffs", naming no operator
            raise ValueError(f"operator {_label(self)}: coeffs must be finite, got {c.detach().tolist()} from its "
                             "coefficients() (training diverged, or a parameter was set to NaN/inf)")
        if c.dim() == 1:
            return c.unsqueeze(0).expand(G, -1)
        if c.shape[0] == 1 and G != 1:
            return c.expand(G, -1)
        if c.shape[0] != G:
            raise ValueError(f"{type(self).__name__} has coefficients for {c.shape[0]} heads, asked for {G}")
        return c

    def apply_matrix(self, P: Tensor, v: Tensor) -> Tensor:
        r"""Apply ``f(P)`` to ``v`` given the materialised ``P`` (default: the polynomial).

        The sum runs on the engine's loop (:func:`~diffusionformer.ops.engine.polynomial`) with
        ``P`` as a :class:`~diffusionformer.ops.dense.MatrixBackend`.

        Shapes:
            ``P``: ``(B, G, N, N)``, ``v``: ``(B, G, N, C)`` -> ``(B, G, N, C)``.
        """
        # as the layer's matrix path: P, the coefficients and the sum in the working dtype (float32 for half v), the
        # result cast to v's dtype once (half coefficients and powers rounded at every step lost several ulps)
        work = work_dtype(v.dtype)
        c = self.head_coefficients(P.shape[1]).to(work)
        G, K = c.shape[0], c.shape[1] - 1
        return polynomial(MatrixBackend(P.to(work), all_heads(G)), v, c, (K,) * G).to(v.dtype)

    def apply_causal_matrix(self, P: Tensor, v: Tensor) -> Tensor:
        r""":meth:`apply_matrix` for a call that guarantees a lower-triangular ``P`` (a causal mask).

        The layer and cached decoding call this hook instead of :meth:`apply_matrix` whenever the
        call is causal (``is_causal``, with or without a further mask such as key padding: the
        causal mask alone zeroes every :math:`P_{ij}, j > i`), so an operator may exploit the
        structure (``ppr-exact``: a triangular solve). The structure comes from the call, never
        from inspecting ``P``. Default: :meth:`apply_matrix` (also for a subclass that overrides
        :meth:`apply_matrix` without overriding this method: its parent's causal hook would contradict it).

        Shapes:
            ``P``: ``(B, G, N, N)`` lower triangular, ``v``: ``(B, G, N, C)`` -> ``(B, G, N, C)``.
        """
        return self.apply_matrix(P, v)

    def check_attention_dropout(self, p: float) -> None:
        r"""Raise a ValueError when dropout ``p`` on ``P`` (kept entries scaled by ``1/(1-p)``) breaks ``f(P)``.

        The layer calls it at construction and before it drops entries of a materialised ``P``
        for :meth:`apply_matrix` (training with ``dropout > 0``). Default: every ``p`` is fine.
        """

    @property
    def uses_context(self) -> bool:
        """Whether the layer must call :meth:`apply_context` (any capability flag is set)."""
        return bool(self.needs_second_map or self.needs_layer_state or self.reprojects_each_step
                    or self.needs_uniform_map)

    def bind(self, *, head_dim: int) -> None:
        """Called once by the layer with its head width ``C``; operators whose parameters
        depend on ``C`` (differential attention) create or check them here. Default: nothing."""

    def apply_context(self, ctx) -> Tensor:  # noqa: ANN001 - RivalContext (ops layer, imported lazily)
        r"""Output of a context operator for its heads, ``(B, G, N, C)`` (see :attr:`uses_context`).

        The default applies :meth:`apply_matrix` to the materialised ``P`` of the context.
        """
        return self.apply_matrix(ctx.attention_matrix(), ctx.v)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


def _label(op: DiffusionOperator) -> str:
    """How an error message names an operator: its ``name`` (quoted), or its class where it has none (a class never
    registered that declares none: the message read "operator ''") or where the name is a registered parent's that
    it runs differently (a subclass overriding ``apply_matrix``: "operator 'heat' does not support the sparse
    back-end ... use ... 'heat'")."""
    name = getattr(op, "name", "")
    if not (isinstance(name, str) and name):
        return type(op).__qualname__
    cls = type(op)
    owner = next((c for c in cls.__mro__ if "name" in c.__dict__), None)
    if owner in _DECLARED and _registered_class(cls) is None:  # inherited, as operator_hops reads it
        return f"{cls.__qualname__} (a subclass of {name!r})"
    return repr(name)


def _checked_degree(op: DiffusionOperator) -> int:
    """A polynomial operator's :attr:`~DiffusionOperator.degree` as an int, else a ValueError naming the class."""
    return check_count(op.degree, f"{type(op).__name__}.degree", minimum=0)


@contextlib.contextmanager
def _host_numbers() -> Iterator[None]:
    """Real CPU tensors for a constructor that reads values as Python numbers: also under ``with torch.device("meta")``
    (deferred init) and inside a :class:`~torch._subclasses.fake_tensor.FakeTensorMode` (a model built as a dry run,
    whose factories make fake tensors: reading one raised ``DataDependentOutputException``)."""
    with unset_fake_temporarily(), torch.device("cpu"):
        yield


def _meta_repr(t: Tensor) -> str | None:
    """What an ``extra_repr`` shows for a tensor on the meta device, its shape (a module built under
    ``with torch.device("meta")`` has no values to read: ``print(model)`` raised); ``None`` for a tensor with values."""
    return f"<meta {tuple(t.shape)}>" if t.is_meta else None


def _check_loaded_constant(op: DiffusionOperator, state_dict: dict, prefix: str, key: str, value: float, arg: str,
                           error_msgs: list[str]) -> None:
    """Report (in ``error_msgs``, as :meth:`~torch.nn.Module.load_state_dict` reports a size mismatch) a saved
    fixed constant ``state_dict[prefix + key]`` that differs from the ``value`` the operator was built with.

    A fixed constant is part of the architecture: a truncated series computes its coefficients from it once,
    at construction, and the operator's spec (``heads_spec``, a run's config) records the constructor's value;
    loading another value into the buffer would change the ``repr`` but not the output (series), or the output
    but not the spec (exact kernels, AttnScale). Compared in the saved tensor's dtype (a half or float32 copy of
    the same value matches). A tensor of one element (a learnable operator's, one head) or of as many as the
    buffer holds is read; other shapes are left to :meth:`~torch.nn.Module.load_state_dict`'s size check.
    """
    saved = state_dict.get(prefix + key)
    own = getattr(op, key, None)
    sizes = (1, own.numel()) if isinstance(own, Tensor) else (1,)
    if not isinstance(saved, Tensor) or saved.is_meta or saved.numel() not in sizes or not saved.is_floating_point():
        return
    flat = saved.detach().cpu().reshape(-1)
    differs = flat != torch.tensor(value, dtype=saved.dtype)
    if bool(differs.any()):
        other = flat[differs][0].item()
        error_msgs.append(
            f"{prefix}{key}: {type(op).__name__} was built with the fixed {arg}={value:g}, the state dict holds "
            f"{arg}={other:g}; a fixed {arg} is part of the architecture (set at construction, recorded in its "
            f"spec): build the operator with {arg}={other:g}, or with learnable=True")


def check_finite_parameter(module: nn.Module, name: str, value: Tensor) -> None:
    """Raise a clear error when a learned parameter became non-finite.

    Eager mode on CPU only (:func:`~diffusionformer.ops._checks.checks_values`): on an accelerator
    the check would synchronise with the device, and under :func:`torch.compile` it would break the graph.
    """
    if checks_values(value) and not torch.isfinite(value.detach()).all():
        raise ValueError(
            f"{type(module).__name__}.{name} is not finite ({value.detach().tolist()}); "
            "training diverged or the parameter was set to NaN/inf"
        )


def static_dtype() -> torch.dtype:
    """The dtype of a new operator's fixed-coefficient buffer: float64 under
    ``torch.set_default_dtype(torch.float64)``, else float32 (:meth:`DiffusionOperator._apply`
    rebuilds it exactly when the module is cast)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


MAX_DEGREE = 1024
"""The most steps (propagations ``P x``) an operator may take: far beyond any useful model,
and small enough that a typo such as ``steps=10**12`` is an error, not a terabyte allocation."""


class _Pow(torch.autograd.Function):
    """``x ** k`` for a table of exponents ``k >= 0`` (broadcast against ``x``) whose derivatives never read a
    negative power: ``d/dx x^k = k x^max(k-1, 0)``, itself a ``_Pow``, so derivatives of every order are finite at
    ``x = 0``. torch's rule for ``pow`` reads ``x^(k-1)`` and masks ``k = 0`` afterwards: its derivative, ``0 * x^-2``
    at ``x = 0``, is ``0 * inf = NaN``. The forward is ``x.pow(k)`` and the first derivative torch's, bit for bit
    for a finite incoming gradient (an inf one gives NaN at ``k = 0``, where pow's rule masks it), in the same
    kernels (no host synchronisation: a ``cumprod``'s backward reads ``(x == 0).any()`` on the host)."""

    generate_vmap_rule = True

    @classmethod
    def apply(cls, x: Tensor, k: Tensor) -> Tensor:  # type: ignore[override]
        # torch's Function.apply binds the arguments of a Function with setup_context by inspect.signature(forward)
        # at every call (3x the cost of the pow itself), which for forward(x, k) called with both returns them
        # unchanged: outside torch.func transforms, the rest of torch's apply without it (under them, torch's own)
        # (torch's own while compiling, and where a torch release lacks the private pieces it is written with)
        if torch.compiler.is_compiling() or _FUNCTORCH_ACTIVE is None or _FUNCTORCH_ACTIVE():
            return super().apply(x, k)
        return super(torch.autograd.Function, cls).apply(*_unwrap_dead_wrappers((x, k)))

    @staticmethod
    def forward(x: Tensor, k: Tensor) -> Tensor:  # type: ignore[override]
        return x.pow(k)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        x, k = inputs
        ctx.save_for_backward(x, k)
        ctx.save_for_forward(x, k)

    @staticmethod
    def _derivative(x: Tensor, k: Tensor, differentiable: bool = True) -> Tensor:
        lower = (k - 1).clamp(min=0)
        return k * (_Pow.apply(x, lower) if differentiable else x.pow(lower))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        x, k = ctx.saved_tensors
        # a backward pass that records no graph (create_graph=False) and runs under no torch.func transform is never
        # differentiated: the pow that _Pow's forward runs, without a Function call
        differentiable = torch.is_grad_enabled() or _FUNCTORCH_ACTIVE is None or _FUNCTORCH_ACTIVE()
        # summed to x's shape (and dtype) by autograd, as pow's
        return grad * _Pow._derivative(x, k, differentiable), None

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor, k_t: Any) -> Tensor:  # type: ignore[override]
        x, k = ctx.saved_tensors
        return x_t * _Pow._derivative(x, k)


def _powers(x: Tensor, k: Tensor) -> Tensor:
    """``x^k`` for the exponents ``k = 0 .. K`` (a 1-D table) along a new last axis: the values, first derivatives
    and dtype of ``x.unsqueeze(-1).pow(k)`` (bit for bit), with derivatives of every order finite at ``x = 0``
    (:class:`_Pow`). ``pow``'s were NaN from the second on at ``x = 0`` (a learned heat time clamped to
    ``min_t = 0``, a PPR ``1 - alpha`` rounded to 0), so ``create_graph=True`` gradients, Hessian-vector products
    and gradient penalties were NaN. While compiling, ``pow`` itself: dynamo refuses a Function with a custom
    ``jvp``, and a compiled graph has no double backward. Under nested forward-mode transforms (``jacfwd(jacfwd(f))``,
    ``jvp`` of ``jvp``) ``pow`` too: torch does not differentiate a Function's ``jvp`` at the outer level (the second
    derivatives read 0 for the powers' share, silently), and ``pow``'s forward rule masks ``k = 0`` (finite at 0)."""
    if torch.compiler.is_compiling() or _nested_forward_ad():
        return x.unsqueeze(-1).pow(k)
    return _Pow.apply(x.unsqueeze(-1), k)


def _nested_forward_ad() -> bool:
    """Whether two or more ``torch.func`` forward-mode (jvp) levels are open (``jacfwd`` inside ``jacfwd``)."""
    if _FUNCTORCH_ACTIVE is None or _INTERPRETERS is None or not _FUNCTORCH_ACTIVE():
        return False
    jvp = torch._C._functorch.TransformType.Jvp
    return sum(i.key() == jvp for i in _INTERPRETERS() or ()) > 1


def check_count(value: object, name: str, *, minimum: int = 1, maximum: int = MAX_DEGREE) -> int:
    """An int argument in ``[minimum, maximum]`` as a Python int (numpy ints from a sweep too;
    bools refused), else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not minimum <= value <= maximum:
        raise ValueError(f"{name} must be an int in [{minimum}, {maximum}], got {value!r}")
    return int(value)


def check_real(value: object, name: str) -> float:
    """A real argument as a float: Python and numpy ints and floats (``np.float32(0.1)`` from a sweep);
    bools, strings, tensors and complex numbers are a TypeError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)


def _check_tol(tol: object) -> float | None:
    """A truncation tolerance (``heat``, ``ppr``): ``None`` or a positive real, numpy scalars included, as a float."""
    if tol is None:
        return None
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not tol > 0:
        raise ValueError(f"tol must be a positive float (or None), got {tol!r}")
    return float(tol)


def check_finite_float(value: object, name: str) -> float:
    """A finite real argument as a float (see :func:`check_real`): a TypeError or ValueError naming it."""
    value = check_real(value, name)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def check_flag(value: object, name: str) -> bool:
    """A bool argument (``learnable=...``): ``'no'`` or ``1`` is a TypeError, not silently ``True``."""
    return _check_flag(value, name)
