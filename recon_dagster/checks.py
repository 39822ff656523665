"""Asset checks of the answers providers give: ``no_not_found_burst`` fails while a provider's
not-found breaker is open (``recon_dagster.breaker``)."""

import dagster as dg

from recon_dagster.assets import BACKLOG
from recon_dagster.breaker import policy_from_env, provider_windows
from recon_dagster.resources import DatabaseResource


@dg.asset_check(
    asset=BACKLOG,
    description="No provider answers mostly 'not found': a burst of not-found answers is a wrong "
    "token, account or base path. While it fails, reconciliation counts attempts instead of "
    "failing and refunding on not-found for that provider.",
)
def no_not_found_burst(database: DatabaseResource) -> dg.AssetCheckResult:
    policy = policy_from_env()
    with database.get_engine().connect() as conn:
        windows = provider_windows(conn, policy)
    tripped = [w for w in windows if w.is_open]
    return dg.AssetCheckResult(
        passed=not tripped,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(
            "not-found breaker open for " + ", ".join(w.provider for w in tripped) if tripped else None
        ),
        metadata={
            "open_for": dg.MetadataValue.json([w.provider for w in tripped]),
            "window_s": policy.window_s,
            "burst": policy.burst,
            **{f"not_found/{w.provider}": w.not_found for w in windows},
            **{f"answers/{w.provider}": w.answers for w in windows},
        },
    )
