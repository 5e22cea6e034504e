"""The configured queue source (settings.source) as a `QueueSource`, built through the one
URL-to-class map (sis_platform.queues.factory) without Dagster: what the queue sensor's
resources build, for sis-live. Passwords come from the environment through the settings
(`url_credentials`), never from a command line."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from sis_platform.queues.base import QueueSource
from sis_platform.queues.factory import open_source
from sis_platform.settings import (
    EmbeddedSourceSettings,
    SourceSettings,
    StompSourceSettings,
    secret,
    url_credentials,
)


def source_from_settings(source: SourceSettings) -> QueueSource:
    """The queue `source` describes (nothing connects until asked)."""
    threshold, backout_queue = source.backout.threshold, source.backout.queue
    if isinstance(source, EmbeddedSourceSettings):
        folder = quote(str(Path(source.path).resolve()))
        return open_source(
            f"embedded://{folder}",
            queue=source.queue,
            backout_threshold=threshold,
            backout_queue=backout_queue,
        )
    if isinstance(source, StompSourceSettings):
        return open_source(
            f"stomp://{source.host}:{source.port}{quote(source.destination)}",
            fallback=url_credentials("stomp"),
            user=source.user,
            selector=source.selector,
            prefetch=source.prefetch,
            redelivery_counts=Path(source.redelivery_counts),
            backout_threshold=threshold,
            backout_queue=backout_queue,
            tls=source.tls,
            ca_file=source.ca_file,
            cert_file=source.cert_file,
            key_file=source.key_file,
            key_password=secret("SIS_STOMP_KEY_PASSWORD") if source.has_key_password else None,
            allow_plaintext_credentials=source.allow_plaintext_credentials,
        )
    return open_source(
        "ibmmq:",
        fallback=url_credentials("ibmmq"),
        ibmmq=source,
        max_get_bytes=source.max_get_bytes,
        backout_threshold=threshold,
        backout_queue=backout_queue,
    )
