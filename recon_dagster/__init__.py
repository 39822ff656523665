"""recon_dagster: reconcile external provider calls that outlived the worker that made them."""

import warnings

__version__ = "0.2.0"

# Dagster 1.13 passes its own beta `owners` parameter whenever it copies a sensor definition
# (binding resources), in the code server, every run and every sensor tick: a BetaWarning about
# Dagster's internals, not about this code, repeated through `dagster dev`'s output. Scoped to
# that message and to warnings raised from Dagster's modules.
warnings.filterwarnings("ignore", message="Parameter `owners`", module="dagster")
