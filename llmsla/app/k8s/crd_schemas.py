"""Strict JSON Schemas for the custom resources in ``deploy/k8s``.

``kubernetes-validate`` skips custom resources without a word and API servers prune unknown
fields where the operators' CRDs preserve them, so a misspelled field would deploy silently.
These schemas, written from the operators' documented fields with ``additionalProperties:
false`` at every level llmsla uses, make such a typo fail ``llmsla deploy validate``. To use a
level listed without fields (TLS, OAuth2, ...), add its fields here first.
See docs/deploy.md#regenerate-and-validate.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
BOOL: Schema = {"type": "boolean"}
NUM: Schema = {"type": "number"}
ANY_OBJECT: Schema = {"type": "object"}  # a level llmsla does not use: typed, not inspected
STR_MAP: Schema = {"type": "object", "additionalProperties": STR}
INT_OR_STR: Schema = {"type": ["integer", "string"]}
#: Prometheus duration, as the operator's CRDs constrain it
DURATION: Schema = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}


def obj(props: dict[str, Schema], *, required: tuple[str, ...] = ()) -> Schema:
    """An object that allows exactly ``props``."""
    out: Schema = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out


def arr(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def enum(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


def resource(api_version: str, kind: str, spec: Schema, *, defs: dict[str, Schema] | None = None) -> Schema:
    """A whole object: apiVersion and kind fixed, the metadata llmsla writes, ``spec``."""
    out = obj({
        "apiVersion": {"const": api_version},
        "kind": {"const": kind},
        "metadata": obj({"name": STR, "namespace": STR, "labels": STR_MAP, "annotations": STR_MAP},
                        required=("name",)),
        "spec": spec,
    }, required=("apiVersion", "kind", "metadata", "spec"))
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = f"{kind} {api_version} (strict, llmsla)"
    if defs:
        out["$defs"] = defs
    return out


# -- Flink Kubernetes Operator ---------------------------------------------------------------
FLINK_VERSIONS = ("v1_13", "v1_14", "v1_15", "v1_16", "v1_17", "v1_18", "v1_19", "v1_20",
                  "v2_0", "v2_1", "v2_2", "v2_3", "v2_4")
_FLINK_RESOURCE = obj({"cpu": NUM, "memory": STR, "ephemeralStorage": STR})
_FLINK_RESOURCES = obj({  # ResourceRequirements (1.16)
    "claims": arr(obj({"name": STR, "request": STR})),
    "limits": {"type": "object", "additionalProperties": INT_OR_STR},
    "requests": {"type": "object", "additionalProperties": INT_OR_STR},
})
#: a core/v1 Pod; checked against Kubernetes' strict Pod schema by validate.py
POD_TEMPLATE: Schema = {"type": "object", "x-llmsla-pod": True}
_FLINK_COMPONENT = obj({"podTemplate": POD_TEMPLATE, "replicas": {"type": "integer", "minimum": 1},
                        "resource": _FLINK_RESOURCE, "resources": _FLINK_RESOURCES})
FLINK_DEPLOYMENT = resource("flink.apache.org/v1beta1", "FlinkDeployment", obj({
    # values stay strings: Flink reads its flat configuration as text
    "flinkConfiguration": STR_MAP,
    "flinkVersion": enum(*FLINK_VERSIONS),
    "image": STR,
    "imagePullPolicy": enum("Always", "IfNotPresent", "Never"),
    "ingress": obj({"annotations": STR_MAP, "className": STR, "labels": STR_MAP, "template": STR,
                    "tls": arr(obj({"hosts": arr(STR), "secretName": STR}))}),
    "job": obj({
        "allowNonRestoredState": BOOL, "args": arr(STR), "autoscalerResetNonce": INT,
        "checkpointTriggerNonce": INT, "entryClass": STR, "initialSavepointPath": STR,
        "jarURI": STR, "parallelism": {"type": "integer", "minimum": 1},
        "savepointRedeployNonce": INT, "savepointTriggerNonce": INT,
        "state": enum("running", "suspended"),
        "upgradeMode": enum("last-state", "savepoint", "stateless"),
    }),
    "jobManager": _FLINK_COMPONENT,
    "logConfiguration": STR_MAP,
    "mode": enum("native", "standalone"),
    "podTemplate": POD_TEMPLATE,
    "restartNonce": INT,
    "serviceAccount": STR,
    "taskManager": _FLINK_COMPONENT,
}, required=("flinkVersion", "image")))

# -- Prometheus Operator -----------------------------------------------------------------------
_RELABEL_ACTIONS = ("replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                    "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep",
                    "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual",
                    "dropequal", "DropEqual")
_RELABEL = obj({
    "action": enum(*_RELABEL_ACTIONS),
    "modulus": INT, "regex": STR, "replacement": STR, "separator": STR,
    "sourceLabels": arr(STR), "targetLabel": STR,
})
_LABEL_SELECTOR = obj({
    "matchLabels": STR_MAP,
    "matchExpressions": arr(obj({"key": STR, "operator": enum("In", "NotIn", "Exists", "DoesNotExist"),
                                 "values": arr(STR)}, required=("key", "operator"))),
})
_NAMESPACE_SELECTOR = obj({"any": BOOL, "matchNames": arr(STR)})
_SECRET_KEY = obj({"key": STR, "name": STR, "optional": BOOL}, required=("key",))
_AUTHORIZATION = obj({"credentials": _SECRET_KEY, "type": STR})
_SCHEME = enum("http", "https", "HTTP", "HTTPS")
_SCRAPE_PROTOCOLS = ("PrometheusProto", "OpenMetricsText0.0.1", "OpenMetricsText1.0.0",
                     "PrometheusText0.0.4", "PrometheusText1.0.0")
_ENDPOINT_COMMON: dict[str, Schema] = {
    "authorization": _AUTHORIZATION, "basicAuth": ANY_OBJECT, "bearerTokenSecret": _SECRET_KEY,
    "enableHttp2": BOOL, "filterRunning": BOOL, "followRedirects": BOOL, "honorLabels": BOOL,
    "honorTimestamps": BOOL, "interval": DURATION, "metricRelabelings": arr(_RELABEL),
    "noProxy": STR, "oauth2": ANY_OBJECT, "params": {"type": "object", "additionalProperties": arr(STR)},
    "path": STR, "port": STR, "proxyConnectHeader": ANY_OBJECT, "proxyFromEnvironment": BOOL,
    "proxyUrl": STR, "relabelings": arr(_RELABEL), "scheme": _SCHEME, "scrapeTimeout": DURATION,
    "targetPort": INT_OR_STR, "tlsConfig": ANY_OBJECT, "trackTimestampsStaleness": BOOL,
}
_MONITOR_COMMON: dict[str, Schema] = {
    "attachMetadata": obj({"node": BOOL}), "bodySizeLimit": STR, "convertClassicHistogramsToNHCB": BOOL,
    "fallbackScrapeProtocol": enum(*_SCRAPE_PROTOCOLS), "jobLabel": STR, "keepDroppedTargets": INT,
    "labelLimit": INT, "labelNameLengthLimit": INT, "labelValueLengthLimit": INT,
    "namespaceSelector": _NAMESPACE_SELECTOR, "nativeHistogramBucketLimit": INT,
    "nativeHistogramMinBucketFactor": INT_OR_STR, "podTargetLabels": arr(STR), "sampleLimit": INT,
    "scrapeClass": STR, "scrapeClassicHistograms": BOOL, "scrapeNativeHistograms": BOOL,
    "scrapeProtocols": arr(enum(*_SCRAPE_PROTOCOLS)), "selector": _LABEL_SELECTOR,
    "selectorMechanism": enum("RelabelConfig", "RoleSelector"), "targetLimit": INT,
}
SERVICE_MONITOR = resource("monitoring.coreos.com/v1", "ServiceMonitor", obj({
    **_MONITOR_COMMON,
    "endpoints": arr(obj({**_ENDPOINT_COMMON, "bearerTokenFile": STR})),
    "serviceDiscoveryRole": enum("Endpoints", "EndpointSlice"),
    "targetLabels": arr(STR),
}, required=("selector",)))
POD_MONITOR = resource("monitoring.coreos.com/v1", "PodMonitor", obj({
    **_MONITOR_COMMON,
    "podMetricsEndpoints": arr(obj({**_ENDPOINT_COMMON, "portNumber": INT})),
}, required=("selector",)))

_RULE = obj({
    "record": STR, "alert": STR, "expr": INT_OR_STR, "for": DURATION, "keep_firing_for": DURATION,
    "labels": STR_MAP, "annotations": STR_MAP,
}, required=("expr",))
_RULE["oneOf"] = [{"required": ["record"]}, {"required": ["alert"]}]
PROMETHEUS_RULE = resource("monitoring.coreos.com/v1", "PrometheusRule", obj({
    "groups": arr(obj({
        "name": STR, "interval": DURATION, "labels": STR_MAP, "limit": INT,
        "partial_response_strategy": STR, "query_offset": DURATION, "rules": arr(_RULE),
    }, required=("name",))),
}))

_MATCHER = obj({"name": STR, "value": STR, "matchType": enum("!=", "=", "=~", "!~"), "regex": BOOL},
               required=("name",))
_ROUTE = obj({
    "activeTimeIntervals": arr(STR), "continue": BOOL, "groupBy": arr(STR), "groupInterval": STR,
    "groupWait": STR, "matchers": arr(_MATCHER), "muteTimeIntervals": arr(STR), "receiver": STR,
    "repeatInterval": STR,
    # the operator's CRD preserves child routes unchecked; llmsla checks them like the root
    "routes": arr({"$ref": "#/$defs/route"}),
})
_WEBHOOK = obj({
    "httpConfig": obj({
        "authorization": _AUTHORIZATION, "basicAuth": ANY_OBJECT, "bearerTokenSecret": _SECRET_KEY,
        "enableHttp2": BOOL, "followRedirects": BOOL, "noProxy": STR, "oauth2": ANY_OBJECT,
        "proxyConnectHeader": ANY_OBJECT, "proxyFromEnvironment": BOOL, "proxyURL": STR,
        "proxyUrl": STR, "tlsConfig": ANY_OBJECT,
    }),
    "maxAlerts": {"type": "integer", "minimum": 0}, "payload": STR, "sendResolved": BOOL,
    "timeout": STR, "url": STR, "urlSecret": _SECRET_KEY,
})
_OTHER_RECEIVERS = ("discordConfigs", "emailConfigs", "msteamsConfigs", "msteamsv2Configs",
                    "opsgenieConfigs", "pagerdutyConfigs", "pushoverConfigs", "rocketchatConfigs",
                    "slackConfigs", "snsConfigs", "telegramConfigs", "victoropsConfigs",
                    "webexConfigs", "wechatConfigs")
ALERTMANAGER_CONFIG = resource("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig", obj({
    "route": {"$ref": "#/$defs/route"},
    "receivers": arr(obj({"name": STR, "webhookConfigs": arr(_WEBHOOK),
                          **{k: arr(ANY_OBJECT) for k in _OTHER_RECEIVERS}}, required=("name",))),
    "inhibitRules": arr(obj({"equal": arr(STR), "sourceMatch": arr(_MATCHER), "targetMatch": arr(_MATCHER)})),
    "muteTimeIntervals": arr(ANY_OBJECT),
}), defs={"route": _ROUTE})

#: (apiVersion, kind) -> strict schema
SCHEMAS: dict[tuple[str, str], Schema] = {
    (s["properties"]["apiVersion"]["const"], s["properties"]["kind"]["const"]): s
    for s in (FLINK_DEPLOYMENT, SERVICE_MONITOR, POD_MONITOR, PROMETHEUS_RULE, ALERTMANAGER_CONFIG)
}


def file_name(api_version: str, kind: str) -> str:
    """``flinkdeployment-flink.apache.org-v1beta1.json``: one file per kind and version."""
    return f"{kind.lower()}-{api_version.replace('/', '-')}.json"
