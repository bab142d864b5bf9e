"""MLflow, reached the same way by every command that uses it: the extra imported only when asked
for, HTTP calls bounded, tracking URIs made absolute, errors in a few words, one store connection.

``gantool train --mlflow`` (:mod:`gantool.training.tracking_mlflow`), ``gantool export --mlflow``
(:mod:`gantool.inference.mlflow_model`) and ``models:/``/``runs:/`` URIs as ``--model``
(:mod:`gantool.runtime.model_uri`) all come through here. Importing this module does not import MLflow.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any

from gantool.core.errors import GantoolError, InputError, first_line

MLFLOW_INSTALL = 'pip install "gantool[mlflow]"'
# MLflow waits 120 s per HTTP request and retries 7 times with a doubling backoff: minutes before a
# dead server is reported. These apply unless the environment sets them.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # a bar per download would bury gantool's own lines
}


def mlflow_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("mlflow") is not None


def import_mlflow(what: str = "--mlflow") -> Any:
    """The ``mlflow`` module, or an InputError naming the extra. Its HTTP calls are bounded."""
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        with quiet_mlflow():
            import mlflow
    except ImportError as e:
        raise InputError(f"{what} needs MLflow ({first_line(e)}); install it with: {MLFLOW_INSTALL}") from None
    return mlflow


@contextlib.contextmanager
def quiet_mlflow() -> Iterator[None]:
    """MLflow's import and store set-up, without SQLAlchemy's and alembic's deprecation warnings
    and start-up chatter (a new SQLite store logs its table creation at INFO)."""
    names = ("alembic", "mlflow.store.db.utils", "mlflow.store.db", "mlflow.pyfunc", "mlflow.models")
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def resolve_tracking_uri(value: str | bool) -> str:
    """An absolute tracking URI: a relative SQLite or file path made absolute (a resume from another
    folder finds the same store); True or "" is MLflow's default (``MLFLOW_TRACKING_URI``, else its
    local default, which MLflow resolves against the current folder)."""
    if value is True or value == "":
        return str(import_mlflow().get_tracking_uri())
    uri = str(value)
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////") and uri != "sqlite:///:memory:":
        path, _, query = uri[len("sqlite:///") :].partition("?")
        uri = "sqlite:///" + os.path.abspath(os.path.expanduser(path)) + (f"?{query}" if query else "")
    elif uri.startswith("file:") and not uri.startswith("file:/"):
        uri = "file:" + os.path.abspath(os.path.expanduser(uri[len("file:") :]))
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else uri


def mlflow_cause(error: BaseException) -> str:
    """MLflow's error in a few words: an HTTP failure as its cause, not urllib3's retry story."""
    text = str(error)
    for pattern, said in (
        (r"Connection refused", "connection refused"),
        (r"Read timed out|ConnectTimeout|timed out", "no answer (timed out)"),
        (r"Name or service not known|Failed to resolve|nodename nor servname", "unknown host"),
        (r"RemoteDisconnected|Connection aborted|Connection reset", "the connection was closed"),
    ):
        if re.search(pattern, text):
            return said
    match = re.search(r"Response body: '(.{0,200})", text)
    return first_line(error, 300) if match is None else f"{first_line(error, 120)} {match.group(1)}"


class MlflowStore:
    """A tracking store and the experiment runs go to, reached once (one line when it cannot be)."""

    def __init__(self, uri: str, client: Any, experiment_id: str, experiment: str) -> None:
        self.uri, self.client, self.experiment_id, self.experiment = uri, client, experiment_id, experiment

    @classmethod
    def connect(cls, uri: str, experiment: str, what: str = "--mlflow") -> MlflowStore:
        mlflow = import_mlflow(what)
        from mlflow.exceptions import MlflowException

        try:
            with quiet_mlflow():
                client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
                found = client.get_experiment_by_name(experiment)
                if found is None:
                    try:
                        experiment_id = client.create_experiment(experiment)
                    except MlflowException:  # another process made it meanwhile
                        found = client.get_experiment_by_name(experiment)
                        if found is None:
                            raise
                if found is not None:
                    if found.lifecycle_stage == "deleted":
                        raise InputError(
                            f"{what} {uri}: the experiment {experiment!r} is deleted there; restore it "
                            "(mlflow experiments restore) or choose another --mlflow-experiment"
                        )
                    experiment_id = found.experiment_id
        except GantoolError:
            raise
        except Exception as e:  # MlflowException, SQLAlchemy's, an unsupported scheme, ...
            raise InputError(f"{what} {uri}: cannot use this MLflow tracking store: {mlflow_cause(e)}") from None
        return cls(uri, client, str(experiment_id), experiment)
