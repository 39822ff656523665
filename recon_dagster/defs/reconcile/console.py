"""The console logger of the reconcile and sweep runs: Dagster's own, minus the stack trace of an
intended failure.

A reconcile run fails on purpose when its provider does not answer (``outage_check`` raises a
``dg.Failure`` with a one-line reason). Dagster's console logger prints every step failure with
its stack trace, twice (the step's and the run's failure): about twenty lines of Dagster's own
frames per outage run, dozens of runs an hour during an outage, in the terminal of ``dagster dev``
and in every log shipper reading the run workers' output. A ``dg.Failure`` is a decision, not a
crash: its console lines keep their reason and drop the frames. The run's event log in the UI
keeps the whole error, stack included; any other exception is printed as Dagster prints it.
"""

from __future__ import annotations

import logging
from typing import Any

import dagster as dg
from dagster._core.utils import coerce_valid_log_level
from dagster._utils.log import create_console_logger  # Dagster's own console logger, filtered

# Dagster instantiates a job's own loggers only when the run config names them: every reconcile and
# sweep run carries this (the sensor's requests, the partitions' config, the sweep's default).
CONSOLE_RUN_CONFIG: dict[str, Any] = {"loggers": {"console": {}}}

_INTENDED = "dagster._core.definitions.events.Failure:"
_STACK = "\n\nStack Trace:\n"


class _IntendedFailureWithoutFrames(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg
        if isinstance(message, str) and _INTENDED in message and _STACK in message:
            record.msg = (
                message.split(_STACK, 1)[0]
                + "\n(an intended failure: its stack trace is in the run's event log)"
            )
        return True


@dg.logger(
    {
        # DEBUG, as Dagster's own console logger of a run without logger config.
        "log_level": dg.Field(
            str, is_required=False, default_value="DEBUG", description="The logger's threshold."
        ),
        "name": dg.Field(str, is_required=False, default_value="dagster", description="The logger's name."),
    },
    description="Dagster's colored console logger, printing an intended dg.Failure (an outage run) "
    "as its one-line reason without Dagster's stack frames (they stay in the run's event log).",
)
def concise_console_logger(init_context: dg.InitLoggerContext) -> logging.Logger:
    config = init_context.logger_config
    logger = create_console_logger(name=config["name"], level=coerce_valid_log_level(config["log_level"]))
    for handler in logger.handlers:
        if not any(isinstance(f, _IntendedFailureWithoutFrames) for f in handler.filters):
            handler.addFilter(_IntendedFailureWithoutFrames())
    return logger
