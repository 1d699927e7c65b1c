"""A small asynchronous Kubernetes API client: GET one object, list pods and EndpointSlices, create Events.

The watcher needs a handful of calls with tight timeouts on its own event loop,
so it speaks HTTP to the API server with aiohttp instead of the blocking
``kubernetes`` client. Where the API server is and how to authenticate comes
from :func:`from_environment`: in a pod the service account (its token file is
re-read every minute, as bound tokens rotate), else the kubeconfig (through the
``kubernetes`` package's loader, so every kubeconfig form it supports works), or
an explicit base URL and bearer token.
"""

from __future__ import annotations

import json
import os
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0


class KubeError(Exception):
    """An API call failed (transport, timeout, or an unexpected status); ``status`` is None for transport errors."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class KubeAuth:
    """Base URL, TLS and bearer token of one API server."""

    base_url: str
    token: str | None = None
    token_file: Path | None = None
    ssl_context: ssl.SSLContext | bool | None = None
    _token_read_at: float = 0.0

    def headers(self) -> dict[str, str]:
        if self.token_file is not None and time.monotonic() - self._token_read_at > TOKEN_REREAD_S:
            self.token = self.token_file.read_text().strip()
            self._token_read_at = time.monotonic()
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def in_cluster_auth(sa_dir: Path = SA_DIR) -> KubeAuth | None:
    """The pod's service account, or None outside a pod."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    token = sa_dir / "token"
    if not host or not port or not token.exists():
        return None
    ctx = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
    host = f"[{host}]" if ":" in host else host
    return KubeAuth(f"https://{host}:{port}", token_file=token, ssl_context=ctx)


def kubeconfig_auth(context: str | None = None) -> KubeAuth:
    """The kubeconfig's current (or named) context, through the ``kubernetes`` package's loader."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(context=context, client_configuration=cfg)
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if token and token.lower().startswith("bearer "):
        token = token[7:]
    ctx: ssl.SSLContext | bool
    if not cfg.verify_ssl:
        ctx = False
    else:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return KubeAuth(cfg.host.rstrip("/"), token=token, ssl_context=ctx)


def from_environment(api_url: str | None = None, token: str | None = None, context: str | None = None) -> KubeAuth:
    """``api_url`` (+ ``token``) if given, else the pod's service account, else the kubeconfig."""
    if api_url:
        return KubeAuth(api_url.rstrip("/"), token=token)
    return in_cluster_auth() or kubeconfig_auth(context)


class KubeClient:
    """The calls the watcher makes; every call is bounded by ``timeout_s``."""

    def __init__(self, auth: KubeAuth, session: aiohttp.ClientSession, timeout_s: float = 2.0) -> None:
        self.auth, self.session = auth, session
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def _request(self, method: str, path: str, body: Any = None,
                       params: dict[str, str] | None = None, content_type: str | None = None) -> tuple[int, Any]:
        """One call; ``body`` is sent as JSON, under ``content_type`` when given (a PATCH needs one of the
        patch types, see :meth:`merge_patch`)."""
        url = self.auth.base_url + path
        headers = self.auth.headers()
        kwargs: dict[str, Any] = {"json": body}
        if content_type is not None:
            headers = {**headers, "Content-Type": content_type}
            kwargs = {"data": json.dumps(body).encode()}
        try:
            async with self.session.request(method, url, params=params, headers=headers,
                                            ssl=self.auth.ssl_context, timeout=self.timeout, **kwargs) as resp:
                text = await resp.text()
                try:
                    data = await resp.json(content_type=None) if text else None
                except ValueError:
                    data = text
                return resp.status, data
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeError(f"{method} {path}: {type(exc).__name__}: {exc}") from None

    async def merge_patch(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """A JSON merge patch (RFC 7386) of the object at ``path``. The API server refuses a PATCH whose
        Content-Type is not a patch type with 415 (k8s.io/apiserver pkg/endpoints/handlers/patch.go
        ``PatchResource``); a merge patch works on built-in kinds and custom resources alike (a strategic
        merge patch does not apply to custom resources such as a LeaderWorkerSet)."""
        return await self._request("PATCH", path, body, content_type="application/merge-patch+json")

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, None on 404; KubeError otherwise."""
        status, data = await self._request("GET", path)
        if status == 404:
            return None
        if status != 200 or not isinstance(data, dict):
            raise KubeError(f"GET {path}: HTTP {status}: {_message(data)}", status)
        return data

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.get(f"/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(name)}")

    async def get_node(self, name: str) -> dict[str, Any] | None:
        return await self.get(f"/api/v1/nodes/{quote(name)}")

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods of ``namespace`` matching the label ``selector`` (``app=noded``)."""
        path = f"/api/v1/namespaces/{quote(namespace)}/pods"
        status, data = await self._request("GET", path, params={"labelSelector": selector})
        if status != 200 or not isinstance(data, dict) or not isinstance(data.get("items") or [], list):
            raise KubeError(f"GET {path}?labelSelector={selector}: HTTP {status}: {_message(data)}", status)
        return [p for p in data.get("items") or [] if isinstance(p, dict)]

    async def list_endpointslices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        """EndpointSlices of a Service (label ``kubernetes.io/service-name``)."""
        path = f"/apis/discovery.k8s.io/v1/namespaces/{quote(namespace)}/endpointslices"
        status, data = await self._request("GET", path, params={"labelSelector": f"kubernetes.io/service-name={service}"})
        if status != 200 or not isinstance(data, dict):
            raise KubeError(f"GET {path}: HTTP {status}: {_message(data)}", status)
        return list(data.get("items") or [])

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        path = f"/api/v1/namespaces/{quote(namespace)}/events"
        status, data = await self._request("POST", path, body=event)
        if status not in (200, 201):
            raise KubeError(f"POST {path}: HTTP {status}: {_message(data)}", status)


def _message(data: Any) -> str:
    if isinstance(data, dict):
        return str(data.get("message") or data.get("reason") or data)[:200]
    return str(data)[:200]
