"""Learning-rate schedule: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math
import numbers

__all__ = ["cosine_lr"]


def cosine_lr(step: int, *, lr: float, min_lr: float, warmup_steps: int, decay_steps: int) -> float:
    r"""Learning rate of update ``step`` (0-based): linear warm-up then cosine decay.

    .. math::

        \eta(s) = \begin{cases}
            \eta_{\max} \frac{s + 1}{W + 1} & s < W \\
            \eta_{\min} + \tfrac12 \left(1 + \cos \pi \frac{s - W}{D - W}\right)
                (\eta_{\max} - \eta_{\min}) & W \le s \le D \\
            \eta_{\min} & s > D
        \end{cases}

    with ``W = warmup_steps`` and ``D = decay_steps``: the peak ``lr`` is reached at ``s = W``
    when ``D > W`` (with ``D = W`` the warm-up ends at ``lr W/(W+1)`` and the next step is at
    ``min_lr``: nanoGPT's formula divides by zero there) and the floor ``min_lr`` at ``s = D`` (SGDR, Loshchilov & Hutter, ICLR 2017, without
    restarts; the warm-up of nanoGPT). A pure function of the step, so a resumed run needs no
    scheduler state beyond the step.

    Args:
        step: number of updates already done (a whole number ``>= 0``).
        lr: peak learning rate (a real number ``>= 0``).
        min_lr: final learning rate (a real number ``>= 0``).
        warmup_steps: ``W >= 0``, a whole number of updates.
        decay_steps: ``D >= W``, a whole number of updates.

    Examples:
        >>> [cosine_lr(s, lr=1.0, min_lr=0.0, warmup_steps=3, decay_steps=5) for s in range(7)]
        [0.25, 0.5, 0.75, 1.0, 0.5, 0.0, 0.0]
    """
    for name, value in (("step", step), ("warmup_steps", warmup_steps), ("decay_steps", decay_steps)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):  # else "'>=' not supported between ..."
            raise TypeError(f"cosine_lr: expected {name} an int >= 0, got {type(value).__name__} ({value!r})")
    if not step >= 0:  # NaN too: it fell through every branch and came back as a NaN learning rate
        raise ValueError(f"cosine_lr: expected step >= 0, got {step}")
    if not warmup_steps >= 0:  # NaN too: it failed every comparison and the cosine came back NaN
        raise ValueError(f"cosine_lr: expected warmup_steps >= 0, got {warmup_steps}")
    if not decay_steps >= warmup_steps:
        raise ValueError(
            f"cosine_lr: expected decay_steps >= warmup_steps ({warmup_steps}), got {decay_steps}"
        )
    # step 1.5 or inf: a rate of no update; a warm-up of 2.5 updates peaked at no update, one of inf gave rate 0
    for name, value in (("step", step), ("warmup_steps", warmup_steps), ("decay_steps", decay_steps)):
        if not isinstance(value, numbers.Integral) and not float(value).is_integer():
            raise ValueError(f"cosine_lr: expected {name} a whole number of updates, got {value}")
    for name, value in (("lr", lr), ("min_lr", min_lr)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):  # True read as 1.0; "3e-4" a bare TypeError
            raise TypeError(f"cosine_lr: expected {name} a float >= 0, got {type(value).__name__} ({value!r})")
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an int beyond the float range: a bare "int too large to convert to float"
            raise ValueError(f"cosine_lr: expected {name} a finite float, got an int beyond the float range "
                             "(|x| > 1.8e308)") from None
        if not finite:  # else a NaN/inf learning rate, handed to the optimizer without a word
            raise ValueError(f"cosine_lr: expected {name} a finite float, got {value}")
        if value < 0:  # else a negative rate set on the optimizer's groups (which its constructor refuses): ascent
            raise ValueError(f"cosine_lr: expected {name} a finite float >= 0, got {value}")
    # a Python float: a NumPy step or rate (np.float64) set as an optimizer's lr made its state_dict unloadable with
    # torch.load(weights_only=True)
    if step < warmup_steps:
        return float(lr * (step + 1) / (warmup_steps + 1))
    if step >= decay_steps:
        return float(min_lr)
    ratio = (step - warmup_steps) / (decay_steps - warmup_steps)
    return float(min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr))
