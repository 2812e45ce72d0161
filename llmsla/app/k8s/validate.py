"""``llmsla deploy validate``: every object of every kustomization, checked offline.

Render with ``kubectl kustomize``, check built-in kinds strictly against each supported
Kubernetes version, custom resources against :mod:`.crd_schemas`, then the policy the manifests
promise (restricted pods, resources, probes, secrets never in a ConfigMap). A kind with no
schema is an error, never a silent pass. See docs/deploy.md#regenerate-and-validate.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from llmsla.app.k8s import crd_schemas, kubectl
from llmsla.app.k8s.render import K8S_DIR

#: the oldest Kubernetes the manifests support (preStop sleep) and the newest schema set
KUBE_VERSIONS = ("1.30.0", "1.37.0")
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job")
_SECRETISH = re.compile(r"(TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL|API_?KEY)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"://[^/\s:@]+:[^/\s@]+@")


def kustomizations(root: Path = K8S_DIR) -> list[Path]:
    """The base and every overlay."""
    return [root / "base", *sorted(p.parent for p in (root / "overlays").glob("*/kustomization.yaml"))]


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads a bare ``=`` (kustomize writes ``matchType: =``) as the obsolete ``value``
    tag; Kubernetes' YAML reads it as a string, and so does this loader."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def build(directory: Path, repo: Path = Path(".")) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(kubectl.kustomize(repo, directory), Loader=_Loader) if d]


def name_of(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def _path(parts: Any) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "(root)"


def builtin_problems(obj: dict[str, Any], versions: tuple[str, ...] = KUBE_VERSIONS) -> list[str]:
    import kubernetes_validate as kv
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

    out = []
    for version in versions:
        try:
            kv.validate(obj, version, strict=True)
        except SchemaNotFoundError:
            return [f"{name_of(obj)}: {obj.get('apiVersion')} {obj.get('kind')} is neither a built-in kind of "
                    f"Kubernetes {version} nor has an llmsla schema (llmsla/app/k8s/crd_schemas.py)"]
        except ValidationError as exc:
            out.append(f"{name_of(obj)}: {_path(exc.path)}: {exc.message} (Kubernetes {version}, strict)")
    return out


def _pod_templates(schema: dict[str, Any], value: Any, path: list[Any]) -> Iterator[tuple[list[Any], dict[str, Any]]]:
    """(path, pod) for every value under a schema node marked ``x-llmsla-pod``."""
    if not isinstance(value, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        if key in value:
            if sub.get("x-llmsla-pod"):
                yield [*path, key], value[key]
            else:
                yield from _pod_templates(sub, value[key], [*path, key])


def custom_problems(obj: dict[str, Any], versions: tuple[str, ...] = KUBE_VERSIONS) -> list[str]:
    import jsonschema

    schema = crd_schemas.SCHEMAS[(obj["apiVersion"], obj["kind"])]
    validator = jsonschema.Draft202012Validator(schema)
    out = [f"{name_of(obj)}: {_path(e.absolute_path)}: {e.message} (llmsla strict schema)"
           for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]
    for path, pod in _pod_templates(schema, obj, []):
        as_pod = {"apiVersion": "v1", "kind": "Pod", **pod}
        as_pod.setdefault("metadata", {"name": "pod-template"})
        out += [f"{name_of(obj)}: {_path(path)}: {p.split(': ', 1)[1]}" for p in builtin_problems(as_pod, versions)]
    return out


def schema_problems(obj: dict[str, Any], versions: tuple[str, ...] = KUBE_VERSIONS) -> list[str]:
    if (obj.get("apiVersion"), obj.get("kind")) in crd_schemas.SCHEMAS:
        return custom_problems(obj, versions)
    return builtin_problems(obj, versions)


def pod_specs(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod spec) of a workload or a FlinkDeployment's pod templates."""
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    if kind in WORKLOADS:
        yield "spec.template.spec", spec.get("template", {}).get("spec", {})
    elif kind == "CronJob":
        yield "spec.jobTemplate.spec.template.spec", spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec", {})
    elif kind == "FlinkDeployment":
        for where in ("podTemplate", "jobManager.podTemplate", "taskManager.podTemplate"):
            node: Any = spec
            for part in where.split("."):
                node = (node or {}).get(part)
            if node:
                yield f"spec.{where}.spec", node.get("spec", {})


def policy_problems(obj: dict[str, Any]) -> list[str]:
    """The promises of docs/deploy.md that no schema can state."""
    out: list[str] = []
    who = name_of(obj)
    if obj.get("kind") == "ConfigMap":
        for key, value in (obj.get("data") or {}).items():
            if _SECRETISH.search(key) or _URL_PASSWORD.search(str(value)):
                out.append(f"{who}: data.{key}: looks like a secret; put it in a Secret")
    for where, pod in pod_specs(obj):
        ctx = pod.get("securityContext", {})
        if ctx.get("runAsNonRoot") is not True:
            out.append(f"{who}: {where}.securityContext.runAsNonRoot must be true")
        if any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")):
            out.append(f"{who}: {where}: host namespaces are not allowed")
        for i, vol in enumerate(pod.get("volumes", [])):
            if "hostPath" in vol:
                out.append(f"{who}: {where}.volumes[{i}]: hostPath is not allowed")
        pod_seccomp = ctx.get("seccompProfile", {}).get("type")
        for j, c in enumerate([*pod.get("initContainers", []), *pod.get("containers", [])]):
            cw = f"{where}.containers[{c.get('name', j)}]"
            sc = c.get("securityContext", {})
            if sc.get("allowPrivilegeEscalation") is not False:
                out.append(f"{who}: {cw}.securityContext.allowPrivilegeEscalation must be false")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                out.append(f"{who}: {cw}.securityContext.capabilities.drop must contain ALL")
            if sc.get("privileged"):
                out.append(f"{who}: {cw}: privileged containers are not allowed")
            if sc.get("seccompProfile", {}).get("type", pod_seccomp) not in ("RuntimeDefault", "Localhost"):
                out.append(f"{who}: {cw}: seccompProfile must be RuntimeDefault or Localhost")
            for e in c.get("env", []):
                if _SECRETISH.search(e.get("name", "")) and "value" in e:
                    out.append(f"{who}: {cw}.env.{e['name']}: a literal secret; use valueFrom.secretKeyRef")
            if obj.get("kind") == "FlinkDeployment":
                continue  # the operator sets the Flink containers' resources (spec.*.resource) and probes
            res = c.get("resources", {})
            for key in ("requests.cpu", "requests.memory", "limits.memory"):
                section, name = key.split(".")
                if name not in res.get(section, {}):
                    out.append(f"{who}: {cw}.resources.{key} is not set")
            if obj.get("kind") in ("Deployment", "DaemonSet", "StatefulSet"):
                for probe in ("readinessProbe", "livenessProbe"):
                    if probe not in c:
                        out.append(f"{who}: {cw}.{probe} is not set")
    return out


def problems(objects: list[dict[str, Any]], versions: tuple[str, ...] = KUBE_VERSIONS) -> list[str]:
    out = []
    for obj in objects:
        out += schema_problems(obj, versions) + policy_problems(obj)
    return out


def validate_all(root: Path = K8S_DIR, repo: Path = Path(".")) -> dict[Path, tuple[int, list[str]]]:
    """kustomization dir -> (objects, problems)."""
    result = {}
    for directory in kustomizations(root):
        objects = build(directory, repo)
        result[directory] = (len(objects), problems(objects))
    return result
