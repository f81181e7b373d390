"""Argument checks shared by the functional API and the modules, and the errors they raise.

Every public entry point validates its arguments here, so that bad input fails
with one clear message instead of broadcasting silently. A mistake in what the
caller asked for raises a :class:`UserError`; every subclass also derives from
the builtin error it refines (``BadValue`` is a ``ValueError``, ...), so
``except ValueError`` keeps working. The command line prints a ``UserError`` as
one line (exit status 2) and anything else, a bug, with its traceback.
"""
from __future__ import annotations

import functools
import math
import numbers
import operator
import os
import pathlib
import warnings
from collections.abc import Sequence

import torch

ShapeLike = int | Sequence[int] | torch.Size

# Under torch.jit.trace sizes are tensors, and each comparison of a check here made a TracerWarning ("the trace
# might not generalize"): a check only raises, so the traced graph is the same whatever it compares. Ignored for
# this module alone, as torch ignores them for its own modules (torch.jit's TracerWarning.ignore_lib_warnings).
warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"normlab\._checks$")


class UserError(Exception):
    """The caller asked for something that cannot be done as asked: fixable by changing the request."""


class BadValue(UserError, ValueError):
    """An argument with the right type but a wrong value: out of range, an unknown name, a wrong shape."""


class BadType(UserError, TypeError):
    """An argument of the wrong kind (a list where a tensor goes, an integer tensor where floats go)."""


class NotFound(UserError, FileNotFoundError):
    """A path the caller named does not exist, or holds nothing of what was asked for."""


class MissingDependency(UserError, ImportError):
    """An optional package the request needs is not installed (the message names the install command)."""


class Unavailable(UserError, RuntimeError):
    """Something the request needs is not on this machine: a system tool, a GPU, torch.distributed."""


class CellsFailed(UserError, RuntimeError):
    """Cells of a sweep raised: their errors are in the store, the finished cells kept; a re-run retries them."""


class Unreachable(UserError, ConnectionError):
    """A network address the caller gave does not answer."""


def path_refused(e: OSError) -> str:
    """An OSError naming a path, as the one line a user reads: the path and the system's reason."""
    return f"{e.filename}: {e.strerror or type(e).__name__}"


def check_choice(value, choices, what: str) -> None:
    """Raise ``BadValue("unknown <what> <value>; valid: a, b, c")`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise BadValue(f"unknown {what} {value!r}; valid: {', '.join(map(str, choices))}")


def existing_file(path, what: str = "file") -> pathlib.Path:
    """``path`` as a ``pathlib.Path`` if it names a file or a pipe (``<(cat ref.rttm)``, ``/dev/stdin``); else
    :class:`NotFound` naming it."""
    p = pathlib.Path(path)
    if not (p.is_file() or p.is_fifo()):
        if p.exists() and not p.is_dir():  # /dev/null read as "no such file"
            raise NotFound(f"{p}: not a {what} (a device or a socket)")
        raise NotFound(f"{p}: no such {what}" + (" (that is a folder)" if p.is_dir() else ""))
    return p


def read_text_file(path, what: str) -> str:
    """The text of ``path`` (UTF-8); :class:`NotFound` if it is not a file, :class:`BadValue` if it is not text."""
    p = existing_file(path)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BadValue(f"{p}: not a text {what} file (not UTF-8)") from None


def as_shape(normalized_shape: ShapeLike) -> tuple[int, ...]:
    """Turn an int, list, tuple or ``torch.Size`` into a tuple of ints."""
    if type(normalized_shape) is int and normalized_shape > 0:  # the common call, checked in ~0.1 µs
        return (normalized_shape,)
    if type(normalized_shape) is tuple and len(normalized_shape) == 1 and type(normalized_shape[0]) is int \
            and normalized_shape[0] > 0:  # a module's own (D,): 0.15 µs where the general path takes 0.8
        return normalized_shape
    if isinstance(normalized_shape, (bool, str, bytes, float)):
        raise BadType(f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")
    if isinstance(normalized_shape, numbers.Integral):  # an int, or numpy's (as torch.nn.LayerNorm takes them)
        shape: tuple[int, ...] = (_dim(normalized_shape),)
    else:
        try:
            shape = tuple(_dim(d) for d in normalized_shape)
        except TypeError:
            raise BadType(
                f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
            ) from None
    if len(shape) == 0:
        raise BadValue("normalized_shape must have at least one dimension, got ()")
    if any(d < 0 for d in shape):
        raise BadValue(f"normalized_shape must be non-negative, got {shape}")
    return shape


def _dim(d) -> int:
    """One dimension: an integer (an int, a numpy or 0-dim torch integer), never a float, string or bool."""
    if isinstance(d, bool):
        raise TypeError("a bool is not a dimension")
    return operator.index(d)


def check_input(x: torch.Tensor, shape: tuple[int, ...], name: str = "input") -> None:
    """Check that ``x`` is a floating tensor whose trailing dims equal ``shape``."""
    if shape and isinstance(x, torch.Tensor) and x.dtype.is_floating_point and x.shape[-len(shape):] == shape:
        return  # the common call, in one test
    if not isinstance(x, torch.Tensor):
        raise BadType(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise BadType(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise BadValue(
            f"normalized_shape {list(shape)} does not match the trailing dimensions of "
            f"{name} with shape {list(x.shape)}"
        )


def check_param(p: torch.Tensor | None, shape: tuple[int, ...], name: str) -> None:
    """Check an optional affine parameter (``weight`` or ``bias``)."""
    if p is None or (isinstance(p, torch.Tensor) and p.dtype.is_floating_point and p.shape == shape):
        return
    if not isinstance(p, torch.Tensor):
        raise BadType(f"{name} must be a torch.Tensor or None, got {type(p).__name__}")
    if not p.dtype.is_floating_point:
        raise BadType(f"{name} must be a floating-point tensor, got dtype {p.dtype}")
    if tuple(p.shape) != shape:
        raise BadValue(f"{name} has shape {list(p.shape)} but normalized_shape is {list(shape)}")


def check_eps(eps: float | None, *, allow_none: bool = False) -> None:
    """``eps`` must be a finite, non-negative number (or None where allowed)."""
    if type(eps) is float and 0.0 <= eps < math.inf:
        return
    if eps is None:
        if allow_none:
            return
        raise BadValue("eps must be a finite non-negative number, got None")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise BadType(f"eps must be a number, got {type(eps).__name__}")
    try:
        finite = math.isfinite(eps)
    except OverflowError:  # an int beyond float range
        finite = False
    if not finite or eps < 0:
        raise BadValue(f"eps must be a finite non-negative number, got {eps}")


def check_device(t: torch.Tensor | None, x: torch.Tensor, name: str) -> None:
    """``t`` (a weight, bias or residual) must be on the input's device: kernels read both through one pointer
    space."""
    if t is not None and t.device != x.device:
        raise BadValue(f"{name} is on {t.device} but the input is on {x.device}")


def check_residual(residual: torch.Tensor, x: torch.Tensor) -> None:
    """BadValue unless the pending ``residual`` has ``x``'s shape: the stream's add never broadcasts (a residual of
    one batch row added to every row would be a wrong answer, not an error)."""
    if isinstance(residual, torch.Tensor) and isinstance(x, torch.Tensor) and residual.shape != x.shape:
        raise BadValue(f"residual has shape {list(residual.shape)} but x has shape {list(x.shape)}")


def check_count(value, name: str, *, least: int = 1) -> None:
    """``value`` must be a whole number >= ``least`` (a size, a count of heads or layers)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise BadValue(f"{name} must be a whole number >= {least}, got {value!r}")


def check_flag(value, name: str) -> None:
    """``value`` must be True or False (numpy's bools and 0/1 too): ``overwrite="no"`` is true in Python."""
    if type(value) is bool:  # the common call, in one test (add_layer_norm's residual_in_fp32, on every call)
        return
    try:
        ok = value in (True, False)
    except (TypeError, ValueError):  # an array compares element by element
        ok = False
    if not ok:
        raise BadType(f"{name} must be True or False, got {value!r}")


def unknown_keywords(fn, given, *, fixed=(), passed=()) -> tuple[list[str], list[str]]:
    """``(own, unknown)``: the parameters of ``fn`` the caller does not set itself (``fixed``), and the names of
    ``given`` that are none of them nor ``passed`` (taken on, as ``device``); no unknown where ``fn`` takes
    ``**kw``. What a builder that forwards keywords checks first: the constructor's TypeError named no option."""
    import inspect

    params = inspect.signature(fn).parameters
    own = [k for k in params if k not in fixed]
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return own, []
    return own, [k for k in given if k not in own and k not in passed]


def check_rate(value, name: str) -> None:
    """``value`` must be a probability in [0, 1) (a dropout rate)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise BadValue(f"{name} must be a number in [0, 1), got {value!r}")


def check_width(x, width: int | None, what: str, *, dims: int | None = None, least: int = 2) -> None:
    """BadValue unless ``x`` is a tensor ending in ``width`` features (any width where None) with ``dims``
    dimensions (at least ``least`` where None): what an encoder or a block refuses before its first layer."""
    if isinstance(x, torch.Tensor) and (x.dim() == dims if dims is not None else x.dim() >= least) and \
            (width is None or x.shape[-1] == width):
        return
    got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
    raise BadValue(f"expected {what} of shape (B, T, {width}), got {got}")


def has_shape(x: torch.Tensor, dims: int, trailing: tuple[int, ...]) -> bool:
    """Whether ``x`` has ``dims`` dimensions, the last ones ``trailing`` (compared here, where a traced size's
    comparison is quiet)."""
    return x.dim() == dims and tuple(x.shape[dims - len(trailing):]) == trailing


def check_length(t: int, most: int, name: str) -> None:
    """BadValue where a sequence of ``t`` steps is longer than ``most`` (the option ``name`` set it)."""
    if t > most:
        raise BadValue(f"sequence length {t} exceeds {name} {most}")


def check_padding_mask(mask, x: torch.Tensor, *, prefix: bool = False) -> None:
    """A padding mask: None, or a bool tensor ``(B, T)`` (True = padding) for ``x`` of shape ``(B, T, ...)``, on
    ``x``'s device. Checked before any layer reads it (a batchnorm updates its statistics with it). With
    ``prefix``, any leading dims of ``x.shape[:-1]`` (``(B,)``: whole sequences). A mask of another dtype is
    refused: an integer mask's ``~`` is a bitwise not (255 for a uint8 0), so padding would weigh as a frame."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        what = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise BadType(f"the padding mask must be a bool tensor (True = padding), got {what}")
    if prefix:
        lead = tuple(x.shape[:-1])
        if mask.dim() > len(lead) or tuple(mask.shape) != lead[:mask.dim()]:
            raise BadValue(f"the padding mask has shape {list(mask.shape)}; an input of shape {list(x.shape)} "
                           f"needs its leading dims {list(lead)} or a prefix of them")
    elif tuple(mask.shape) != tuple(x.shape[:2]):
        raise BadValue(f"the padding mask has shape {list(mask.shape)}; an input of shape {list(x.shape)} needs "
                       f"(B, T) = {list(x.shape[:2])}")
    if mask.device != x.device:
        raise BadValue(f"the padding mask is on {mask.device}, the input on {x.device}")


_OFF, _ON = ("0", "false", "no", "off"), ("1", "true", "yes", "on", "")


def env_on(name: str) -> bool:
    """A switch in the environment: on unless ``name`` is set to 0, false, no or off (any case, spaces ignored).
    Any other value than those and 1, true, yes, on (or empty) is taken as on, with a warning once per value."""
    value = os.environ.get(name, "1").strip().lower()
    if value not in _OFF + _ON:
        _warn_switch(name, os.environ[name])
    return value not in _OFF


@functools.cache
def _warn_switch(name: str, value: str) -> None:
    import warnings

    warnings.warn(f"{name}={value!r} is not a switch (1, true, yes, on, or 0, false, no, off): taken as on",
                  RuntimeWarning, stacklevel=4)


def env_whole(name: str, default: str | None = None, *, least: int = 0, most: int | None = None) -> int:
    """The whole number a launcher put in the environment variable ``name`` (``default`` where unset), checked
    against ``least`` and ``most``: one line naming the variable and its value instead of ``int()``'s traceback."""
    text = os.environ.get(name, default)
    try:
        v = int(text) if text is not None else None
    except ValueError:
        v = None
    if v is None or v < least or (most is not None and v > most):
        bound = f"from {least} to {most}" if most is not None else f">= {least}"
        raise BadValue(f"the launcher's {name}={text!r} is not a whole number {bound}")
    return v


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype statistics are accumulated in: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def eps_vanishes(eps: float, dtype: torch.dtype) -> bool:
    """Whether ``eps`` counts as 0 for rows of ``dtype``: below the smallest normal number of the accumulation
    dtype, where ``var + eps`` of a constant row can round to 0."""
    return eps < torch.finfo(acc_dtype(dtype)).tiny


def default_rms_eps(dtype: torch.dtype) -> float:
    """What ``torch.nn.RMSNorm(eps=None)`` uses: machine epsilon of the accumulation dtype.

    torch's documentation says ``torch.finfo(x.dtype).eps``, but its kernels compute
    half-precision input in float32 and use ``torch.finfo(float32).eps`` (checked
    against torch 2.13): float16/bfloat16/float32 -> 1.19e-07, float64 -> 2.22e-16.
    """
    return torch.finfo(acc_dtype(dtype)).eps
