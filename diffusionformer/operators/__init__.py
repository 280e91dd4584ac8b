"""Operator registry and the built-in diffusion operators.

Every operator is a :class:`DiffusionOperator`: its :meth:`~DiffusionOperator.coefficients`
are the weights on ``P^0 .. P^K``. Resolve one by name with :func:`build_operator`.
"""

from diffusionformer.operators.base import DiffusionOperator
from diffusionformer.operators.registry import (
    build_operator,
    list_operators,
    operator_class,
    parse_operator_spec,
    register_operator,
    unregister_operator,
)
from diffusionformer.operators.basic import AttentionOperator, LaplacianOperator
from diffusionformer.operators.heat import (
    ExactHeatOperator,
    HeatOperator,
    heat_coefficients,
    heat_steps_for_tolerance,
    heat_truncation_error,
)
from diffusionformer.operators.ppr import PPROperator, ppr_coefficients, ppr_steps_for_tolerance
from diffusionformer.operators.polynomial import PolynomialOperator, chebyshev_matrix
from diffusionformer.operators.ppr_exact import ExactPPROperator
from diffusionformer.operators.attnscale import AttnScaleOperator
from diffusionformer.operators.neutreno import NeuTRENOOperator, ValueResidualOperator
from diffusionformer.operators.differential import DifferentialOperator, lambda_init_schedule
from diffusionformer.operators.grand import NonlinearDiffusionOperator

__all__ = [
    "AttentionOperator",
    "AttnScaleOperator",
    "DifferentialOperator",
    "ExactPPROperator",
    "NeuTRENOOperator",
    "NonlinearDiffusionOperator",
    "ValueResidualOperator",
    "chebyshev_matrix",
    "lambda_init_schedule",
    "DiffusionOperator",
    "ExactHeatOperator",
    "HeatOperator",
    "LaplacianOperator",
    "PPROperator",
    "PolynomialOperator",
    "build_operator",
    "heat_coefficients",
    "heat_steps_for_tolerance",
    "heat_truncation_error",
    "list_operators",
    "operator_class",
    "parse_operator_spec",
    "ppr_coefficients",
    "ppr_steps_for_tolerance",
    "register_operator",
    "unregister_operator",
]
