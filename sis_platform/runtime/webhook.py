"""Posting a notification to an operator's webhook (SIS_NOTIFY_WEBHOOK_URL): one JSON object per
POST, with a bearer token from SIS_NOTIFY_WEBHOOK_TOKEN when set.

Bounded and safe whatever the receiver does: the request has a timeout, TLS verifies the
receiver's certificate and name (Python's default context), redirects are refused (a redirect
could carry the token to another host), and at most `RESPONSE_BYTES` of the answer are read.
The URL was checked when the settings were read (https, or http to loopback only, and no
credentials in it: sis_platform/settings/loading.py). Imports nothing of the platform.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TIMEOUT_SECONDS = 10.0
RESPONSE_BYTES = 4096  # read of the receiver's answer, for the error message only
USER_AGENT = "sis-platform-notify/1"


class WebhookFailed(OSError):
    """The receiver could not be reached, or did not answer 2xx."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is then an HTTPError, reported as a failure


@dataclass(frozen=True)
class Webhook:
    """Where notifications go, and the bearer token to send (None: no Authorization)."""

    url: str
    token: str | None = None
    timeout_seconds: float = TIMEOUT_SECONDS

    def post(self, payload: Mapping[str, Any]) -> None:
        """POST `payload` as JSON; WebhookFailed unless the receiver answers 2xx in time."""
        body = json.dumps(payload, sort_keys=True, default=str).encode()
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        opener = urllib.request.build_opener(
            _NoRedirect(), urllib.request.HTTPSHandler(context=ssl.create_default_context())
        )
        try:
            with opener.open(request, timeout=self.timeout_seconds) as response:
                response.read(RESPONSE_BYTES)
        except urllib.error.HTTPError as error:
            answer = error.read(RESPONSE_BYTES).decode(errors="replace")
            raise WebhookFailed(
                f"the webhook {self.shown} answered {error.code} {error.reason}: {answer[:200]}"
            ) from None
        except (urllib.error.URLError, OSError, TimeoutError) as error:
            reason = getattr(error, "reason", error)
            raise WebhookFailed(f"the webhook {self.shown} cannot be reached: {reason}") from None

    @property
    def shown(self) -> str:
        """The URL without its query string (which may hold a receiver's key)."""
        return self.url.split("?", 1)[0]
