"""The Kubernetes discovery source against an API server on a loopback socket: the pod list as
the API conventions define it (PodList pages with ``limit`` and ``continue``, a ``410 Expired``
continue token, ``Status`` bodies for 401/403, label selectors), plain HTTP as ``kubectl proxy``
serves it and HTTPS with the service account's mounted CA and rotated token; then the gateway's
membership and the engine scraper's targets following it while pods come, go and terminate."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import discovery, names, services
from llmsla.app.engines_cli import following
from llmsla.control.membership import Membership
from llmsla.control.probe import HealthProber
from llmsla.control.router import Router
from llmsla.discovery import DiscoveryError, Found, replica_id
from llmsla.discovery_k8s import (
    KubernetesApi,
    KubernetesSource,
    engine_of_label,
    port_problem,
    selector_problem,
)
from llmsla.discovery_metrics import DiscoveryMetrics

from .test_membership import _health_server

NS = "inference"


def pod(name: str, ip: str | None, *, labels: dict[str, str] | None = None, ready: bool = True,
        phase: str = "Running", deleting: bool = False, ports: tuple[tuple[str, int], ...] = (("http", 8000),)) -> dict[str, Any]:
    """A pod as ``kubectl get pod -o json`` shows one (the fields the source reads, and their neighbours)."""
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "4242",
                            "creationTimestamp": "2026-12-07T10:00:00Z", "labels": dict(labels or {}),
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "vllm-7d9",
                                                 "uid": "rs", "controller": True}]}
    if deleting:
        meta |= {"deletionTimestamp": "2026-12-07T10:05:00Z", "deletionGracePeriodSeconds": 30}
    status: dict[str, Any] = {
        "phase": phase, "hostIP": "10.0.0.1", "startTime": "2026-12-07T10:00:01Z", "qosClass": "Guaranteed",
        "conditions": [{"type": t, "status": "True" if (ready or t in ("PodScheduled", "Initialized")) else "False",
                        "lastProbeTime": None, "lastTransitionTime": "2026-12-07T10:00:09Z"}
                       for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
    }
    if ip is not None:
        status |= {"podIP": ip, "podIPs": [{"ip": ip}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                     "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports]}],
                     "nodeName": "gpu-node-1", "restartPolicy": "Always"},
            "status": status}


def matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selectors (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``), ANDed."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            ok = labels.get(k) != v
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            ok = labels.get(k) == v
        else:
            ok = (term[1:] not in labels) if term.startswith("!") else term in labels
        if not ok:
            return False
    return True


def status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


class FakeApi:
    """The pods endpoint of an API server: ``GET /api/v1/namespaces/{ns}/pods`` with
    ``labelSelector``, ``limit`` and an opaque ``continue``; a bearer token when ``token`` is set;
    ``expire`` continue tokens answered 410 Expired; every request recorded."""

    def __init__(self, pods: list[dict[str, Any]], *, token: str | None = None) -> None:
        self.pods = pods
        self.token = token
        self.expire = 0
        self.forbidden = False
        self.hang = False
        self.released = asyncio.Event()  # a hanging answer waits for it (set when stopping)
        self.answer: tuple[int, bytes] | None = None
        self.requests: list[tuple[str, dict[str, str], str | None]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def pods_of(self, request: web.Request) -> web.StreamResponse:
        q = dict(request.query)
        self.requests.append((request.match_info["ns"], q, request.headers.get("Authorization")))
        if self.hang:
            await self.released.wait()
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return status(401, "Unauthorized", "Unauthorized")
        if self.forbidden:
            return status(403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:llmsla:llmsla-gateway" '
                                            f'cannot list resource "pods" in API group "" in the namespace "{NS}"')
        if self.answer is not None:
            return web.Response(status=self.answer[0], body=self.answer[1], content_type="application/json")
        if q.get("fieldSelector", "status.phase=Running") != "status.phase=Running":
            return status(400, "BadRequest", f"unexpected fieldSelector {q['fieldSelector']!r} in this test")
        if "continue" in q and "resourceVersion" in q:  # the API's own rule
            return status(400, "BadRequest", "specifying resource version is not allowed when using continue")
        items = [p for p in self.pods if p["metadata"]["namespace"] == request.match_info["ns"]
                 and matches(p["metadata"]["labels"], q.get("labelSelector", ""))
                 and ("fieldSelector" not in q or p["status"]["phase"] == "Running")]
        start = 0
        if "continue" in q:
            if self.expire:
                self.expire -= 1
                return status(410, "Expired", "The provided continue parameter is too old to display a consistent "
                                              "list result. You can start a new list without the continue parameter.")
            start = int(json.loads(q["continue"])["start"])
        limit = int(q.get("limit", "0")) or len(items)
        page = items[start:start + limit]
        meta: dict[str, Any] = {"resourceVersion": "4242"}
        if start + limit < len(items):
            meta |= {"continue": json.dumps({"start": start + limit}), "remainingItemCount": len(items) - start - limit}
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page})

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> str:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.pods_of)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        port = services.free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port, ssl_context=ssl_context).start()
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self.released.set()
        if self.runner is not None:
            await self.runner.cleanup()


def cfg_of(**env: str) -> config_mod.Config:
    """A configuration with these ``gateway.*`` keys set, as the environment sets them."""
    return config_mod.load(env={f"LLMSLA_GATEWAY_{k.upper()}": v for k, v in env.items()})


def source(api_url: str, selector: str = "app=vllm", **kw: Any) -> KubernetesSource:
    return KubernetesSource(KubernetesApi(api_url, account_dir=Path("/nonexistent")), selector,
                            namespace=kw.pop("namespace", NS), default_pool="default", **kw)


FLEET = [
    pod("vllm-0", "10.1.0.10", labels={"app": "vllm", names.ENGINE_TYPE_POD_LABEL: "vllm"}),
    pod("vllm-1", "10.1.0.11", labels={"app": "vllm", names.ENGINE_TYPE_POD_LABEL: "sglang", "pool": "canary"}),
    pod("vllm-2", "fd00::12", labels={"app": "vllm", names.ENGINE_TYPE_POD_LABEL_LLMD: "trtllm-serve"}),
    pod("vllm-3", "10.1.0.13", labels={"app": "vllm", names.ENGINE_TYPE_POD_LABEL: "Triton-TensorRT-LLM"}),
    pod("vllm-4", "10.1.0.14", labels={"app": "vllm", names.ENGINE_TYPE_POD_LABEL: "ollama"}),  # unknown engine
    pod("vllm-5", "10.1.0.15", labels={"app": "vllm"}, ready=False),  # failing its readiness probe
    pod("vllm-6", "10.1.0.16", labels={"app": "vllm"}, deleting=True),  # terminating: drained
    pod("vllm-7", None, labels={"app": "vllm"}, phase="Pending", ready=False),  # not scheduled yet
    pod("vllm-8", "10.1.0.18", labels={"app": "vllm"}, phase="Succeeded", ready=False),
    pod("vllm-9", "10.1.0.19", labels={"app": "vllm", "pool": "p" * 300}),  # longer than an event's label
    pod("vllm-11", "10.1.0.21", labels={"app": "vllm", "pool": ""}),  # an empty label: gateway.pool
    pod("vllm-10", "10.1.0.20", labels={"app": "vllm"}, ports=(("grpc", 9000),)),  # no port named http
    pod("other", "10.1.0.30", labels={"app": "redis"}),  # not selected
]


def test_ready_pods_become_replicas_with_their_engine_and_pool(caplog):
    async def main() -> tuple[list[Found], list[Found], FakeApi]:
        elsewhere = pod("elsewhere", "10.2.0.1", labels={"app": "vllm"})
        elsewhere["metadata"]["namespace"] = "other"
        api = FakeApi([*FLEET, elsewhere])
        url = await api.start()
        try:
            src = source(url, port="http", pool_label="pool")
            by_name = await src.resolve()
            assert await src.resolve() == by_name
            by_number = await source(url, port="8000").resolve()
        finally:
            await api.stop()
        return by_name, by_number, api

    with caplog.at_level(logging.WARNING, logger="llmsla.discovery_k8s"):
        by_name, by_number, api = asyncio.run(main())
    assert by_name == sorted([
        Found("default", "http://10.1.0.10:8000", names.ENGINE_VLLM),
        Found("canary", "http://10.1.0.11:8000", names.ENGINE_SGLANG),
        Found("default", "http://[fd00::12]:8000", names.ENGINE_TRTLLM),
        Found("default", "http://10.1.0.13:8000", names.ENGINE_TRITON),
        Found("default", "http://10.1.0.14:8000", ""),  # unknown engine: its pool's engine.types
        Found("default", "http://10.1.0.21:8000", ""),
    ])
    # by number: the pod without a port named http counts too, every pool is gateway.pool
    assert [f.url for f in by_number] == sorted([f.url for f in by_name] + ["http://10.1.0.19:8000",
                                                                              "http://10.1.0.20:8000"])
    assert {f.pool for f in by_number} == {"default"}
    assert [(ns, q, auth) for ns, q, auth in api.requests] == [
        (NS, {"labelSelector": "app=vllm", "fieldSelector": "status.phase=Running", "limit": "500", "resourceVersion": "0"},
         None)] * 3
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "vllm-4: engine type 'ollama' is none of" in text
    assert "vllm-10 has no container port named 'http'" in text
    assert "vllm-9: label pool='ppppp" in text and "is no pool name (longer than 256 characters" in text
    assert text.count("vllm-4") == 2  # once per problem and source (two here), not every round


def test_a_large_namespace_is_read_page_by_page_and_an_expired_list_starts_over():
    fleet = [pod(f"w-{i}", f"10.3.{i // 250}.{i % 250}", labels={"app": "vllm"}) for i in range(1203)]

    async def main() -> None:
        api = FakeApi(fleet)
        url = await api.start()
        try:
            got = await source(url).resolve()
            assert len(got) == 1203 and len(api.requests) == 3  # 500 + 500 + 203
            assert [("continue" in q) for _, q, _ in api.requests] == [False, True, True]
            assert [q.get("resourceVersion") for _, q, _ in api.requests] == ["0", None, None]
            api.requests.clear()
            api.expire = 1  # the snapshot behind the continue token expired: one fresh list
            assert len(await source(url).resolve()) == 1203
            assert [("continue" in q) for _, q, _ in api.requests] == [False, True, False, True, True]
            api.expire = 2  # expired again while listing again: an error, the caller keeps its set
            with pytest.raises(DiscoveryError, match="HTTP 410: The provided continue parameter is too old") as err:
                await source(url).resolve()
            assert err.value.reason == names.DISCOVERY_FAIL_API
        finally:
            await api.stop()

    asyncio.run(main())


def test_api_errors_keep_the_last_set_with_a_reason_that_says_why():
    async def main() -> None:
        api = FakeApi(FLEET)
        url = await api.start()
        try:
            api.forbidden = True
            with pytest.raises(DiscoveryError) as err:
                await source(url).resolve()
            assert err.value.reason == names.DISCOVERY_FAIL_DENIED
            assert 'cannot list resource "pods"' in str(err.value) and "discovery-rbac.yaml" in str(err.value)
            api.forbidden = False
            for answer, reason, needle in [
                ((500, b'{"kind":"Status","message":"etcdserver: request timed out","code":500}'),
                 names.DISCOVERY_FAIL_API, "HTTP 500: etcdserver: request timed out"),
                ((200, b"<html>a proxy's login page</html>"), names.DISCOVERY_FAIL_READ, "not a PodList"),
                ((200, b'{"kind":"PodList","items":null}'), names.DISCOVERY_FAIL_READ, "not a PodList"),
            ]:
                api.answer = answer
                with pytest.raises(DiscoveryError, match=needle) as err:
                    await source(url).resolve()
                assert err.value.reason == reason
            good = pod("good", "10.1.0.40", labels={"app": "vllm"})
            junk = [7, "x", {"metadata": None}, {**good, "metadata": {"name": "m1", "labels": ["app"]}},
                    {**good, "status": {**good["status"], "conditions": ["Ready"]}},
                    {**good, "spec": {"containers": {"ports": 1}}},
                    {**good, "status": {**good["status"], "podIP": "evil.example"}}]
            api.answer = (200, json.dumps({"kind": "PodList", "metadata": {}, "items": [*junk, good]}).encode())
            # junk items are not pods: none is a replica, and none costs the good pod its place
            assert await source(url, port="http").resolve() == [Found("default", "http://10.1.0.40:8000")]
            api.answer, api.hang = None, True
            with pytest.raises(DiscoveryError, match="no answer within 0.3 s") as err:
                await source(url, timeout_s=0.3).resolve()
            assert err.value.reason == names.DISCOVERY_FAIL_TIMEOUT
        finally:
            await api.stop()
        with pytest.raises(DiscoveryError) as err:  # nothing listens there any more
            await source(url).resolve()
        assert err.value.reason == names.DISCOVERY_FAIL_API

    asyncio.run(main())


def _ca_and_server_cert(tmp: Path) -> tuple[Path, Path, Path]:
    """A cluster CA and the API server's certificate for 127.0.0.1, signed by it (openssl)."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=kubernetes-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=kube-apiserver")
    (tmp / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:kubernetes.default.svc\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "server.crt", "-days", "2", "-extfile", "ext")
    return tmp / "ca.crt", tmp / "server.crt", tmp / "server.key"


def test_in_a_pod_it_trusts_the_cluster_ca_and_reads_the_rotated_token(tmp_path):
    ca, crt, key = _ca_and_server_cert(tmp_path)
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("token-1\n")
    (account / "namespace").write_text(NS)

    async def main() -> None:
        api = FakeApi(FLEET, token="token-1")
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(crt, key)
        await api.start(tls)
        port = api.url.rsplit(":", 1)[1]
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
        try:
            # no CA mounted: the system's roots do not know the cluster's, so no answer is trusted
            src = KubernetesSource(KubernetesApi(account_dir=account, environ=env), "app=vllm", default_pool="default")
            assert src.namespace == NS and src.api.base_url == api.url
            with pytest.raises(DiscoveryError, match="certificate verify failed") as err:
                await src.resolve()
            assert err.value.reason == names.DISCOVERY_FAIL_API
            (account / "ca.crt").write_bytes(ca.read_bytes())
            assert len(await src.resolve()) == 8  # port 8000 by number, every pool gateway.pool
            assert api.requests[-1][2] == "Bearer token-1"
            (account / "token").write_text("token-2\n")  # the kubelet rotated it
            api.token = "token-2"
            assert len(await src.resolve()) == 8
            assert api.requests[-1][2] == "Bearer token-2"
            api.token = "token-3"  # a token the API no longer takes
            with pytest.raises(DiscoveryError, match="HTTP 401") as err:
                await src.resolve()
            assert err.value.reason == names.DISCOVERY_FAIL_DENIED
        finally:
            await api.stop()

    asyncio.run(main())
    with pytest.raises(DiscoveryError, match="not in a Kubernetes pod"):
        KubernetesApi(environ={})
    # kubectl proxy (plain HTTP): the mounted token is never sent in clear text
    assert KubernetesApi("http://127.0.0.1:8001", account_dir=account).headers() == {"Accept": "application/json"}
    assert KubernetesApi("https://10.96.0.1", account_dir=account).headers()["Authorization"] == "Bearer token-2"


def test_the_gateway_and_the_engine_scraper_follow_pods_that_come_and_go():
    """Pods on loopback health servers: a new ready pod joins after its probe, a terminating one
    drains, one failing readiness leaves; the scraper's targets carry each pod's engine."""

    async def main() -> None:
        servers = [await _health_server(200) for _ in range(3)]
        ports = [int(u.rsplit(":", 1)[1]) for _, u in servers]

        def worker(i: int, engine: str, **kw: Any) -> dict[str, Any]:
            return pod(f"w-{i}", "127.0.0.1", labels={"app": "vllm", names.ENGINE_TYPE_POD_LABEL: engine},
                       ports=(("http", ports[i]),), **kw)

        api = FakeApi([worker(0, "vllm"), worker(1, "sglang")])
        url = await api.start()
        cfg = config_mod.load(env={"LLMSLA_GATEWAY_DISCOVERY": "kubernetes", "LLMSLA_GATEWAY_DISCOVERY_KUBERNETES": "app=vllm",
                                   "LLMSLA_GATEWAY_DISCOVERY_KUBERNETES_NAMESPACE": NS,
                                   "LLMSLA_GATEWAY_DISCOVERY_KUBERNETES_PORT": "http",
                                   "LLMSLA_GATEWAY_DISCOVERY_KUBERNETES_API": url,
                                   "LLMSLA_ENGINE_TYPES": "default=trtllm"})
        config_mod.check_startup(cfg)
        src = discovery.source_from_config(cfg)
        assert isinstance(src, KubernetesSource) and src.describe() == f"kubernetes pods 'app=vllm' in {NS}"
        reg = CollectorRegistry()
        router = Router([], "round_robin", registry=reg)
        m = Membership(router, src, default_pool="default", interval_s=0.05, prober=HealthProber(router),
                       metrics=DiscoveryMetrics("kubernetes", registry=reg))
        ids = [replica_id("default", f"http://127.0.0.1:{p}", "default") for p in ports]
        try:
            async with aiohttp.ClientSession() as s:
                ch = await m.sync_once(s)
                assert sorted(ch.joined) == sorted(ids[:2])
                assert {router.pick("default").id for _ in range(10)} == set(ids[:2])
                assert {r.id: r.engine for r in router.replicas()} == {ids[0]: "vllm", ids[1]: "sglang"}
                api.pods.append(worker(2, "garbage"))  # scaled up: an engine label llmsla cannot read
                api.pods[0] = worker(0, "vllm", deleting=True)  # scaled down: terminating
                ch = await m.sync_once(s)
                assert ch.joined == [ids[2]] and ch.left == [ids[0]]
                assert {router.pick("default").id for _ in range(10)} == {ids[1], ids[2]}
                api.pods[1] = worker(1, "sglang", ready=False)  # failing its readiness probe
                assert (await m.sync_once(s)).left == [ids[1]]
                api.forbidden = True  # RBAC removed: the last set stays, counted as denied
                assert (await m.sync_once(s)).kept
                assert reg.get_sample_value(names.DISCOVERY_FAILURES + "_total",
                                            {"source": "kubernetes", "reason": "denied"}) == 1
                api.forbidden = False
                # the engine scraper: the pod's label, else the pool's engine.types; --type over both
                api.pods[1] = worker(1, "sglang")
                resolve, name, _ = following(cfg, [], None, None, None)
                targets = {t.replica: (t.engine, t.url) for t in await resolve()}
                assert name == "kubernetes" and targets == {
                    ids[1]: ("sglang", f"http://127.0.0.1:{ports[1]}/metrics"),
                    ids[2]: ("trtllm", f"http://127.0.0.1:{ports[2]}/prometheus/metrics")}
                resolve, _, _ = following(cfg, [], None, "vllm", None)
                assert {t.engine for t in await resolve()} == {"vllm"}
        finally:
            await api.stop()
            for runner, _ in servers:
                await runner.cleanup()

    asyncio.run(main())


def test_keys_are_checked():
    assert engine_of_label(" SGLang ") == names.ENGINE_SGLANG and engine_of_label("tgi") is None
    assert port_problem("8000") is None and port_problem("http") is None and port_problem("metrics-2") is None
    for bad in ("0", "70000", "HTTP", "-http", "a-very-long-port-name", "", "8000/tcp"):
        assert port_problem(bad) is not None, bad
    assert selector_problem("app in (vllm,sglang),tier!=cpu") is None and selector_problem("") is None
    assert selector_problem("app=vllm\n") is not None and selector_problem(" app=vllm") is not None

    typed = config_mod.load(env={"LLMSLA_ENGINE_TYPES": "default=trtllm-serve,canary=Triton-TensorRT-LLM,big=sglang"})
    assert [typed.engine.engine_of(p) for p in ("default", "canary", "big", "other")] == [
        names.ENGINE_TRTLLM, names.ENGINE_TRITON, names.ENGINE_SGLANG, names.ENGINE_AUTO]
    with pytest.raises(config_mod.ConfigError, match="or a pod label's triton-tensorrt-llm, trtllm-serve"):
        config_mod.load(env={"LLMSLA_ENGINE_TYPES": "default=tgi"})
    with pytest.raises(config_mod.ConfigError, match="needs gateway.discovery_kubernetes"):
        config_mod.check_startup(cfg_of(discovery="kubernetes"))
    with pytest.raises(config_mod.ConfigError, match="discovery_kubernetes_port"):
        cfg_of(discovery="kubernetes", discovery_kubernetes="app=vllm", discovery_kubernetes_port="HTTP")
    with pytest.raises(config_mod.ConfigError, match="discovery_kubernetes_api"):
        cfg_of(discovery="kubernetes", discovery_kubernetes="app=vllm", discovery_kubernetes_api="ftp://x")


def test_doctor_says_whether_discovery_answers_and_what_to_do_when_it_does_not(tmp_path):
    """``llmsla doctor``'s discovery row: the replicas one round finds (pools, engine labels), or
    the failure's reason with its fix (RBAC for a refused list, the file for a missing one); a
    warning for replicas in a pool no request reaches and for an arm whose pool has none."""
    from llmsla.app import doctor

    async def main() -> list[doctor.Check]:
        api = FakeApi(FLEET)
        url = await api.start()
        k8s = {"discovery": "kubernetes", "discovery_kubernetes": "app=vllm", "discovery_kubernetes_namespace": NS,
               "discovery_kubernetes_api": url, "discovery_kubernetes_pool_label": "pool"}
        try:
            got = [await asyncio.to_thread(doctor.check_discovery, cfg_of(**k8s, pools="canary"))]
            api.forbidden = True
            got.append(await asyncio.to_thread(doctor.check_discovery, cfg_of(**k8s)))
            api.forbidden = False
            got.append(await asyncio.to_thread(doctor.check_discovery, cfg_of(**k8s | {"discovery_kubernetes": "app=none"})))
            # the canary pool undeclared: its pod gets no request; an arm's pool without a pod: 503s
            arms = {"exp": {"arms": {"a": {}, "b": {"pool": "blue"}}}}
            got.append(await asyncio.to_thread(doctor.check_discovery, config_mod.load(env={
                **{f"LLMSLA_GATEWAY_{k.upper()}": v for k, v in k8s.items()}, "LLMSLA_GATEWAY_POOLS": "blue",
                "LLMSLA_AB_EXPERIMENTS": json.dumps(arms)})))
        finally:
            await api.stop()
        return got

    ok, denied, empty, idle = asyncio.run(main())
    assert ok.status == doctor.OK and ok.detail == (f"kubernetes pods 'app=vllm' in {NS}: 7 replica(s); pools canary 1, "
                                                    "default 6; engine labels sglang 1, triton 1, trtllm 1, vllm 1")
    assert denied.status == doctor.FAIL and denied.detail.startswith("kubernetes (denied): ")
    assert "kubectl apply -k deploy/k8s/inference" in denied.fix
    assert empty.status == doctor.WARN and "names no replica" in empty.detail
    assert idle.status == doctor.WARN and idle.detail.endswith(
        "; pool 'canary' has replicas no request reaches (the configuration does not name it)"
        "; arm exp:b sends its units to pool 'blue', which has no replica: they are answered 503")
    assert "gateway.pools" in idle.fix and "weight 0" in idle.fix
    missing = doctor.check_discovery(cfg_of(discovery="file", discovery_file=str(tmp_path / "nope")))
    assert missing.status == doctor.FAIL and "create gateway.discovery_file" in missing.fix
    unset = doctor.check_discovery(cfg_of(discovery="kubernetes"))
    assert unset.status == doctor.FAIL and "needs gateway.discovery_kubernetes" in unset.detail
    static = doctor.check_discovery(cfg_of(upstreams="http://127.0.0.1:9001,http://127.0.0.1:9002"))
    assert (static.status, static.detail) == (doctor.OK, "static: 2 replica(s) configured")
    assert "check_discovery" in doctor.run_checks.__code__.co_names  # a row of every doctor run
