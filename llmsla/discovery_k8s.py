"""The Kubernetes discovery source: the ready pods a label selector names, read from the API.

Why beside DNS: a headless Service tells addresses only. The pods themselves say which engine
serves (the ``inference.networking.k8s.io/engine-type`` label the Gateway API Inference
Extension and llm-d's router read, or llm-d's ``llm-d.ai/engine-type``) and, with
``gateway.discovery_kubernetes_pool_label``, which pool they belong to; the engine adapters read
a replica by its own label, as the field's routers do. Like the other sources it answers "which
replicas are there now?" once per ``gateway.discovery_interval_s`` with one list call (paginated,
so a large namespace costs a few pages, never a watch held open), and the caller turns the
differences into joins and drains.

A pod counts when it is Running, has an IP, its ``Ready`` condition is ``True`` and it is not
being deleted (the set a headless Service's DNS answers with): a pod failing its readiness probe
or terminating leaves the answer and is drained. In a pod the API is found and authenticated as
every in-cluster client does (``KUBERNETES_SERVICE_HOST``/``_PORT``, the service account's token,
re-read every round because the kubelet rotates it, and its CA); ``gateway.discovery_kubernetes_api``
points elsewhere (``kubectl proxy``'s ``http://127.0.0.1:8001``). See docs/gateway.md#discovery.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from llmsla import names
from llmsla.discovery import DiscoveryError, Found, address_url

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)

#: Where a pod's service account credentials are mounted (every in-cluster client reads them here).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: Pods asked for per page of the list call.
PAGE_SIZE = 500
#: The largest page read (500 pods are about 5 MiB of JSON).
MAX_BODY = 64 << 20


def engine_of_label(value: str) -> str | None:
    """The engine type a pod's engine-type label names (the field's values ``vllm``, ``sglang``,
    ``trtllm-serve``, ``triton-tensorrt-llm``, or llmsla's own), None for another value."""
    return names.ENGINE_LABEL_VALUES.get(value.strip().lower())


def port_problem(value: str) -> str | None:
    """The check of ``gateway.discovery_kubernetes_port``: a port number or a container port's
    name (an IANA_SVC_NAME: at most 15 lower-case letters, digits and '-')."""
    if value.isdigit():
        return None if 0 < int(value) < 65536 else f"port must be 1-65535, got {value}"
    ok = 0 < len(value) <= 15 and all(c.islower() or c.isdigit() or c == "-" for c in value)
    if not ok or not any(c.islower() for c in value) or value.startswith("-") or value.endswith("-"):
        return f"expected a port number or a container port's name (e.g. http), got {value!r}"
    return None


def selector_problem(value: str) -> str | None:
    """The check of ``gateway.discovery_kubernetes`` ("" = not set): a label selector the API
    reads (``app=vllm``, ``app in (vllm,sglang),tier!=cpu``); the API server judges its grammar,
    this refuses what cannot be one."""
    if value and (value != value.strip() or any(ord(c) < 32 for c in value)):
        return "a label selector has no control characters and no leading or trailing spaces"
    return None


class KubernetesApi:
    """Where the API server is and how to authenticate to it: in a pod, from the environment
    and the service account mount; else ``base_url`` (e.g. ``kubectl proxy``), with the service
    account's token and CA when they are mounted."""

    def __init__(self, base_url: str = "", *, account_dir: Path = SERVICE_ACCOUNT_DIR,
                 environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        if not base_url:
            host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise DiscoveryError("not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST): set "
                                     "gateway.discovery_kubernetes_api (e.g. http://127.0.0.1:8001 from kubectl proxy)",
                                     names.DISCOVERY_FAIL_API)
            try:
                base_url = address_url("https", host, int(port))
            except ValueError:  # a name, not an address
                base_url = f"https://{host}:{port}"
        self.base_url = base_url.rstrip("/")
        self.token_file = account_dir / "token"
        self.ca_file = account_dir / "ca.crt"
        self.namespace_file = account_dir / "namespace"

    def own_namespace(self) -> str:
        """The namespace of the pod this runs in, ``default`` outside one."""
        try:
            return self.namespace_file.read_text(encoding="utf-8").strip() or "default"
        except OSError:
            return "default"

    def headers(self) -> dict[str, str]:
        """Accept JSON; over HTTPS, the bearer token as mounted now (the kubelet rotates it on
        disk). Never over plain HTTP: ``kubectl proxy`` authenticates itself, and a token sent
        in clear text to another URL would be a credential handed to the network."""
        out = {"Accept": "application/json"}
        if not self.base_url.startswith("https://"):
            return out
        try:
            token = self.token_file.read_text(encoding="utf-8").strip()
        except OSError:
            token = ""
        if token:
            out["Authorization"] = f"Bearer {token}"
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        """The cluster's CA for an https API (the system's roots where none is mounted)."""
        if not self.base_url.startswith("https://"):
            return None
        return ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file.is_file() else None)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, an IP, condition Ready True, not being deleted: what a Service would route to."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def pod_port(pod: Mapping[str, Any], port: str) -> int | None:
    """``port`` as a number, or the number of the container port of that name (None: no such)."""
    if port.isdigit():
        return int(port)
    for container in (pod.get("spec") or {}).get("containers") or ():
        for p in container.get("ports") or ():
            if p.get("name") == port and isinstance(p.get("containerPort"), int):
                return int(p["containerPort"])
    return None


class KubernetesSource:
    """The ready pods of ``selector`` in ``namespace`` as replicas ``http://podIP:port``; each
    :class:`Found` carries the engine its label names and, with ``pool_label``, the pool its
    label names (else ``default_pool``)."""

    def __init__(self, api: KubernetesApi, selector: str, *, namespace: str = "", port: str = "8000",
                 default_pool: str, pool_label: str = "", timeout_s: float = 5.0) -> None:
        self.api = api
        self.selector = selector
        self.namespace = namespace or api.own_namespace()
        self.port = port
        self.default_pool = default_pool
        self.pool_label = pool_label
        self.timeout_s = timeout_s
        self._warned: set[str] = set()

    def describe(self) -> str:
        return f"kubernetes pods {self.selector!r} in {self.namespace}"

    async def resolve(self) -> list[Found]:
        try:
            async with asyncio.timeout(self.timeout_s):
                pods = await self._list()
        except TimeoutError:
            raise DiscoveryError(f"{self.api.base_url}: no answer within {self.timeout_s:g} s",
                                 names.DISCOVERY_FAIL_TIMEOUT) from None
        found: dict[Found, None] = {}
        for pod in pods:
            try:
                f = self._found(pod)
            except (AttributeError, KeyError, TypeError, ValueError) as exc:  # one malformed pod, not the round
                name = pod.get("metadata", {}).get("name") if isinstance(pod.get("metadata"), dict) else None
                self._warn(f"pod {name!r}: not a pod as the API writes one ({type(exc).__name__}: {exc}); left out")
                continue
            if f is not None:
                found[f] = None
        return sorted(found)

    def _found(self, pod: Mapping[str, Any]) -> Found | None:
        from llmsla.config import label_problem

        if not pod_ready(pod):
            return None
        meta = pod.get("metadata") or {}
        name, labels = str(meta.get("name", "?")), meta.get("labels") or {}
        port = pod_port(pod, self.port)
        if port is None:
            self._warn(f"pod {name} has no container port named {self.port!r}; left out")
            return None
        pool = self.default_pool
        value = str(labels.get(self.pool_label) or "") if self.pool_label else ""
        if value:  # a label set to "" is no pool either
            if (p := label_problem(value)) is not None:
                self._warn(f"pod {name}: label {self.pool_label}={value!r} is no pool name ({p}); left out")
                return None
            pool = value
        engine = ""
        raw = labels.get(names.ENGINE_TYPE_POD_LABEL, labels.get(names.ENGINE_TYPE_POD_LABEL_LLMD))
        if raw is not None:
            engine = engine_of_label(str(raw)) or ""
            if not engine:
                self._warn(f"pod {name}: engine type {raw!r} is none of "
                           f"{', '.join(sorted(names.ENGINE_LABEL_VALUES))}; read as its pool's engine.types")
        try:
            url = address_url("http", str(pod["status"]["podIP"]), port)
        except ValueError:
            self._warn(f"pod {name}: podIP {pod['status']['podIP']!r} is not an IP address; left out")
            return None
        return Found(pool, url, engine)

    def _warn(self, msg: str) -> None:
        if msg not in self._warned:  # once per distinct problem, not every round
            if len(self._warned) >= 4096:  # a fleet churning through problem pods: start over
                self._warned.clear()
            self._warned.add(msg)
            log.warning("discovery: %s", msg)

    async def _list(self) -> list[dict[str, Any]]:
        """Every running pod of the selector, page by page; a continue token that expired
        meanwhile (410 Gone: the snapshot the pages come from is gone) starts the list over, once.
        The first page asks for ``resourceVersion=0``: any recent state will do for a poll, and
        the API server then answers from its watch cache instead of reading etcd (it may then
        ignore ``limit`` and answer in one page, which reads the same)."""
        import aiohttp  # here: the configuration's checks import this module, and they stay light

        path = f"/api/v1/namespaces/{quote(self.namespace, safe='')}/pods"
        pods: list[dict[str, Any]] = []
        token, restarted = "", False
        async with aiohttp.ClientSession(headers=self.api.headers(), trust_env=False) as session:
            while True:
                query = {"labelSelector": self.selector, "fieldSelector": "status.phase=Running", "limit": str(PAGE_SIZE)}
                if token:
                    query["continue"] = token
                else:  # served from the API server's watch cache, not a quorum read of etcd
                    query["resourceVersion"] = "0"
                status, body = await self._get(session, f"{path}?{urlencode(query)}")
                if status == 410 and token and not restarted:
                    pods, token, restarted = [], "", True
                    continue
                page = _page(status, body, self.describe())
                pods += page["items"]
                token = str((page.get("metadata") or {}).get("continue") or "")
                if not token:
                    return pods

    async def _get(self, session: aiohttp.ClientSession, path_query: str) -> tuple[int, bytes]:
        import aiohttp

        try:
            async with session.get(self.api.base_url + path_query, ssl=self.api.ssl_context() or True,
                                   allow_redirects=False) as resp:
                body = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > MAX_BODY:
                        raise DiscoveryError(f"{self.describe()}: a page over {MAX_BODY >> 20} MiB",
                                             names.DISCOVERY_FAIL_READ)
                return resp.status, bytes(body)
        except (aiohttp.ClientError, OSError, ssl.SSLError) as exc:
            raise DiscoveryError(f"{self.api.base_url}: {type(exc).__name__}: {exc}", names.DISCOVERY_FAIL_API) from None


def _page(status: int, body: bytes, what: str) -> dict[str, Any]:
    """A PodList page, or the DiscoveryError its status and body say (the API's ``Status``
    message; 401/403 with the permission it needs)."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if status == 200 and isinstance(doc, dict) and isinstance(doc.get("items"), list):
        doc["items"] = [p for p in doc["items"] if isinstance(p, dict)]
        return doc
    message = doc.get("message") if isinstance(doc, dict) else None
    detail = str(message)[:300] if message else body[:200].decode("utf-8", "replace")
    if status in (401, 403):
        raise DiscoveryError(f"{what}: HTTP {status}: {detail} (the gateway's service account needs get and list "
                             "on pods in that namespace: deploy/k8s/inference/discovery-rbac.yaml)",
                             names.DISCOVERY_FAIL_DENIED)
    if status == 200:
        raise DiscoveryError(f"{what}: not a PodList: {detail}", names.DISCOVERY_FAIL_READ)
    raise DiscoveryError(f"{what}: HTTP {status}: {detail}", names.DISCOVERY_FAIL_API)
