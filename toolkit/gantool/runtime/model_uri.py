"""``--model models:/NAME/VERSION``, ``models:/NAME@alias`` and ``runs:/RUN_ID/PATH``: MLflow URIs
as model paths, downloaded once into gantool's cache.

:func:`local_model` turns such a URI into a local export folder; any other value is returned as it
is, so every command and :func:`gantool.runtime.backends.load_backend` can call it first. The store
is MLflow's (``MLFLOW_REGISTRY_URI``, else ``MLFLOW_TRACKING_URI``, else MLflow's local default).

A pinned URI (a model version, a logged model's id, a run's path) never changes, so once it is in the
cache it is used from there without MLflow: no import, no network, no download. An alias
(``@champion``) or ``latest`` can move, so it is asked of the registry each time (one request),
then its version comes from the cache. The cache is ``$GANTOOL_CACHE``, else
``$XDG_CACHE_HOME/gantool``, else ``~/.cache/gantool``; each entry is downloaded into a temporary
folder beside it and renamed into place whole, so a killed download leaves nothing half-made.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from gantool.core.artifacts import export_files
from gantool.core.errors import GantoolError, InputError, ModelError
from gantool.core.fileio import TMP_PREFIX
from gantool.core.mlflow_store import import_mlflow, mlflow_cause, quiet_mlflow, resolve_tracking_uri

log = logging.getLogger(__name__)

MLFLOW_URI_PREFIXES = ("models:/", "runs:/")
CACHE_ENV = "GANTOOL_CACHE"
# Pinned: a version number, a logged model's id (MLflow 3: m-<hex>), or a run's artifact path.
_PINNED = re.compile(r"^(models:/[^/@]+/\d+|models:/m-[0-9a-f]+|runs:/[^/]+/.+)$")


def is_mlflow_uri(model: object) -> bool:
    return isinstance(model, str) and model.startswith(MLFLOW_URI_PREFIXES)


def cache_dir() -> Path:
    """Where downloaded models are kept (see the module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser() / "mlflow"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gantool" / "mlflow"


def store_uri() -> str:
    """The registry a URI is resolved in, as MLflow picks it, without importing MLflow (its local
    default depends on the current folder, which the key then holds)."""
    uri = os.environ.get("MLFLOW_REGISTRY_URI") or os.environ.get("MLFLOW_TRACKING_URI")
    return resolve_tracking_uri(uri) if uri else f"default@{os.getcwd()}"


def local_model(model: str | Path | None) -> str | Path | None:
    """``model`` itself, or for an MLflow URI the local export folder it names (downloaded once)."""
    if not is_mlflow_uri(model):
        return model
    uri = str(model)
    if _PINNED.match(uri):
        cached = _cached(uri)
        if cached is not None:
            return cached
    mlflow = import_mlflow(f"--model {uri}")
    registry = store_uri()
    pinned = uri if _PINNED.match(uri) else _pin(mlflow, uri)
    return _cached(pinned) or _download(mlflow, pinned, uri, registry)


def _entry(uri: str) -> Path:
    key = hashlib.sha256(f"{store_uri()}\n{uri}".encode()).hexdigest()[:24]
    return cache_dir() / key


def _cached(uri: str) -> Path | None:
    entry = _entry(uri)
    return _export_in(entry) if entry.is_dir() else None


def _pin(mlflow: object, uri: str) -> str:
    """``models:/NAME@alias`` or ``models:/NAME/latest`` as the version it names now."""
    from mlflow.exceptions import MlflowException

    name, _, rest = uri[len("models:/") :].partition("/")
    try:
        with quiet_mlflow():
            client = mlflow.MlflowClient()  # type: ignore[attr-defined]
            if "@" in name:
                name, alias = name.split("@", 1)
                version = client.get_model_version_by_alias(name, alias).version
            elif rest == "latest":
                found = client.search_model_versions(f"name='{name}'", order_by=["version_number DESC"], max_results=1)
                if not found:
                    raise ModelError(f"--model {uri}: the registered model {name!r} has no version")
                version = found[0].version
            else:
                raise ModelError(
                    f"--model {uri}: expected models:/NAME/VERSION, models:/NAME@ALIAS, models:/NAME/latest "
                    "or runs:/RUN_ID/PATH"
                )
    except GantoolError:
        raise
    except MlflowException as e:
        raise ModelError(f"--model {uri}: not found in the MLflow registry {store_uri()}: {mlflow_cause(e)}") from None
    return f"models:/{name}/{version}"


def _download(mlflow: object, uri: str, asked: str, registry: str) -> Path:
    entry = _entry(uri)
    entry.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=entry.parent))
    try:
        try:
            with quiet_mlflow():
                mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(stage))  # type: ignore[attr-defined]
        except Exception as e:  # MlflowException: no such model, version, run or path; a store that is down
            where = f"{asked} ({uri})" if asked != uri else uri
            raise ModelError(
                f"--model {where}: cannot download it from MLflow ({registry}): {mlflow_cause(e)}"
            ) from None
        if _export_in(stage) is None:
            raise ModelError(f"--model {asked}: what MLflow holds there is not a gantool export (no model file)")
        try:
            stage.rename(entry)
        except OSError:  # another process put the same entry in place meanwhile
            if not entry.is_dir():
                raise InputError(f"cannot write the model cache {entry}") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    found = _export_in(entry)
    assert found is not None
    log.info("%s: downloaded from %s into %s (kept: the next use reads it from there)", asked, registry, entry)
    return found


def _export_in(folder: Path) -> Path | None:
    """The export folder inside a downloaded MLflow model (``artifacts/<name>/``) or artifact path."""
    candidates = [folder, *sorted(p for p in (folder / "artifacts").glob("*") if p.is_dir())]
    candidates += sorted(p for p in folder.glob("*") if p.is_dir() and p.name != "artifacts")
    for candidate in candidates:
        if export_files(candidate):
            return candidate
    return None
