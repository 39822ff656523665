"""Asset checks of the answers providers give: ``no_not_found_burst`` fails while the not-found
breaker is open for a provider or one of its kinds (``recon_dagster.reconcile.breaker``)."""

import dagster as dg

from recon_dagster.defs.observe.backlog import BACKLOG
from recon_dagster.defs.resources import DatabaseResource
from recon_dagster.defs.settings_check import breaker_policy
from recon_dagster.reconcile.breaker import provider_windows


@dg.asset_check(
    asset=BACKLOG,
    description="No provider, and no provider kind, answers mostly 'not found': a burst of not-found "
    "answers is a wrong token, account, endpoint or base path. Counted per kind (healthy answers of "
    "a sibling kind do not dilute a kind's burst) and per provider. While it fails, reconciliation "
    "counts attempts instead of failing and refunding on not-found for that kind.",
)
def no_not_found_burst(database: DatabaseResource) -> dg.AssetCheckResult:
    policy = breaker_policy()
    with database.get_engine().connect() as conn:
        windows = provider_windows(conn, policy)
    tripped = [w.name for w in windows if w.is_open]
    return dg.AssetCheckResult(
        passed=not tripped,
        severity=dg.AssetCheckSeverity.ERROR,
        description="not-found breaker open for " + ", ".join(tripped) if tripped else None,
        metadata={
            "open_for": dg.MetadataValue.json(tripped),
            "window_s": policy.window_s,
            "burst": policy.burst,
            **{f"not_found/{w.name}": w.not_found for w in windows},
            **{f"answers/{w.name}": w.answers for w in windows},
        },
    )
