"""The machine's settings every pipeline shares (``PIPELINES_<FIELD>``) and the object store's tuning."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from blocks.settings import EnvSettings


class MachineSettings(EnvSettings):
    """Settings of the machine rather than of a pipeline: CPU slots, private folders, notifications, launch keys."""

    _env_scope: ClassVar[str] = "pipelines"

    cpu_heavy_slots: int | None = Field(
        default=None, description="CPU-heavy tasks run at once on this machine; unset: its cores."
    )
    cpu_slots_dir: str | None = Field(
        default=None, description="Folder of the CPU slot files; unset: cpu-slots in the runtime folder."
    )
    runtime_dir: str | None = Field(
        default=None,
        description="This user's private folder for sockets and slot files (refused if not private); unset: "
        "$XDG_RUNTIME_DIR/pipelines, else a private folder in the temporary folder or ~/.cache.",
    )
    data_dir: str | None = Field(
        default=None, description="The local stack's data folder; unset: .data at the repository root."
    )
    notify_block: str | None = Field(
        default=None,
        description="Notification block as 'block-type-slug/name' (e.g. slack-webhook/on-call); unset: the log.",
    )
    launch_key: SecretStr | None = Field(
        default=None,
        description="The key that seals what a row says to run (`make up` makes one in .data/secrets/launch-key).",
    )
    launch_key_previous: SecretStr | None = Field(
        default=None, description="Keys of a rotation, comma-separated: seals made with them are still accepted."
    )
    fault: str | None = Field(default=None, description="Tests only: the crash plan of the fault injector.")
    fault_log: str | None = Field(default=None, description="Tests only: the file the fault injector logs its hits to.")


class ObjectStoreTuning(EnvSettings):
    """How the object store writes large objects to S3."""

    _env_scope: ClassVar[str] = "object_store"

    multipart_mb: float = Field(
        default=8, description="S3 multipart threshold and part size (MiB; at least 5, S3's smallest part)."
    )
