"""Datasets: a build's output and a training run's input are the same MLflow dataset (name, digest, profile)."""
from __future__ import annotations

import os
from typing import Any

from storage.redact import redact_text, redact_url

DATASET_DIGEST_CHARS = 16  # of the manifest's sha256 (MLflow keeps at most 36 characters of a digest)


def built_dataset(manifest: Any):
    """The MLflow dataset of a finished build (a ``corpus.schema.Manifest``): named after its folder, its source
    the folder's URL, its digest the manifest's sha256 (what pre-training tags as ``dataset.manifest_sha256``), a
    profile of its size and the shards' columns as its schema."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.types import DataType
    from mlflow.types.schema import Array, ColSpec, Schema

    from corpus.schema import instance_schema

    profile = {"instances": manifest.instances, "shards": len(manifest.shards),
               "max_seq_length": manifest.max_seq_length, "vocab_size": manifest.vocab.size,
               "config_hash": manifest.config_hash[:12]}

    class BuiltDataset(MetaDataset):
        @property
        def profile(self) -> dict[str, Any]:
            return profile

        def to_dict(self) -> dict[str, str]:
            import json

            return super().to_dict() | {"profile": json.dumps(profile)}

    url = redact_url(manifest.url)  # what MLflow shows; the full URL only reads
    with warnings.catch_warnings():  # a local path "can be interpreted in multiple ways": all of them local
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(url)  # absolute: read_manifest resolves a local path
    schema = Schema([ColSpec(Array(DataType.integer) if str(f.type).startswith("list") else DataType.integer, f.name)
                     for f in instance_schema(manifest.vocab.size)])
    return BuiltDataset(source, name=os.path.basename(url.rstrip("/")) or url,
                        digest=manifest.sha256[:DATASET_DIGEST_CHARS], schema=schema)


def log_dataset(tracking_uri: str, run_id: str, manifest: Any, context: str) -> None:
    """Record a finished build (a ``corpus.schema.Manifest``) on a run: ``context="output"`` on the build's run,
    ``"training"`` / ``"eval"`` on a pre-training run (MLflow 3 has dataset inputs only, so the build's output is an
    input tagged "output"). Same name and digest on both, so the UI's Dataset column shows which build a model was
    trained on."""
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    entity = built_dataset(manifest)._to_mlflow_entity()
    MlflowClient(tracking_uri).log_inputs(run_id, datasets=[
        DatasetInput(entity, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])])


def log_task_data(tracking_uri: str, run_id: str, url: str, *, context: str, name: str, profile: dict[str, Any],
                  endpoint_url: str | None = None) -> None:
    """A fine-tuning run's task data as an MLflow dataset input (the runs table's Dataset column): named after the
    file (and the split), its source the file's URL, its digest the file's sha256 plus what selects the rows
    (`profile`: split, seed, subset sizes), so two runs on the same rows show the same dataset."""
    import hashlib
    import json
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    from storage.fs import read_bytes

    digest = hashlib.sha256(read_bytes(url, endpoint_url)).hexdigest()
    digest = hashlib.sha256(f"{digest} {json.dumps(profile, sort_keys=True)}".encode()).hexdigest()

    class TaskData(MetaDataset):
        @property
        def profile(self) -> dict[str, Any]:
            return profile

        def to_dict(self) -> dict[str, str]:
            return super().to_dict() | {"profile": json.dumps(profile)}

    with warnings.catch_warnings():  # a local path "can be interpreted in multiple ways": all of them local
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(redact_url(url))  # what MLflow shows; the full URL only reads
    entity = TaskData(source, name=redact_text(name), digest=digest[:DATASET_DIGEST_CHARS])._to_mlflow_entity()
    MlflowClient(tracking_uri).log_inputs(run_id, datasets=[
        DatasetInput(entity, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])])
