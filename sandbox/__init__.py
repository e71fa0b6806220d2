"""The local sandbox: each trial in a daemonless OCI container (podman), built from the task's Dockerfile."""

from prefect_harbor.sandbox.container import IMPORT_PATH, ContainerEnvironment
from prefect_harbor.sandbox.images import BaseImageNotFoundError, ImageBuildError, prepare_task_image, present_images, task_image_names

__all__ = [
    "IMPORT_PATH", "BaseImageNotFoundError", "ContainerEnvironment", "ImageBuildError", "prepare_task_image", "present_images", "task_image_names",
]  # fmt: skip
