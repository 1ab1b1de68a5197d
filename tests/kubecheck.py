"""Independent checkers for what hotcache hands to Kubernetes: node-feature-discovery's
documented feature-file rules, Kubernetes' label rules, and the OpenAPI schemas of a
pinned Kubernetes release (kubernetes-validate). Written from the documentation, not from
hotcache's own code, so that a test using them cannot agree with a bug."""

from __future__ import annotations

import datetime as dt
import re

import yaml

# The Kubernetes release whose OpenAPI schemas the manifests must satisfy.
KUBERNETES_RELEASE = "1.33.0"

# k8s.io/apimachinery validation: a qualified name is [prefix/]name; the prefix a DNS-1123
# subdomain (<= 253), the name <= 63 of [-A-Za-z0-9_.] starting and ending alphanumeric.
_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
EXPIRY = "# +expiry-time="
MAX_FEATURE_FILE = 64 * 1024


def check_label_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    assert slash, f"{key}: NFD wants <namespace>/<name> (unprefixed names are deprecated)"
    assert len(prefix) <= 253 and _SUBDOMAIN.fullmatch(prefix), f"{key}: bad prefix"
    assert not (prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")) or \
        prefix == "feature.node.kubernetes.io" or \
        prefix.endswith(".feature.node.kubernetes.io"), f"{key}: namespace denied by nfd-master"
    assert len(name) <= 63 and _NAME.fullmatch(name), f"{key}: bad name part"


def check_label_value(key: str, value: str) -> None:
    assert len(value) <= 63 and _VALUE.fullmatch(value), f"{key}={value!r}: bad label value"


def parse_feature_file(text: str, now: dt.datetime) -> dict[str, str]:
    """The node labels nfd-worker's local source makes of `text` at time `now`:
    `<key>[=<value>]` lines (value defaults to "true"), `#` comments, and `# +expiry-time=`
    (RFC 3339) directives that apply to the lines after them. Raises on anything NFD
    would not turn into a label."""
    assert len(text.encode()) <= MAX_FEATURE_FILE, "NFD ignores feature files over 64 kB"
    labels: dict[str, str] = {}
    expires: dt.datetime | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(EXPIRY):
            stamp = stripped[len(EXPIRY):]
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", stamp), \
                f"{stamp!r} is not RFC 3339"
            expires = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            continue
        if not stripped or stripped.startswith("#"):
            continue
        key, _, value = stripped.partition("=")
        value = value if "=" in stripped else "true"
        check_label_key(key)
        check_label_value(key, value)
        if expires is None or expires > now:
            labels[key] = value
    return labels


def expiry_of(text: str) -> dt.datetime:
    (line,) = [x for x in text.splitlines() if x.startswith(EXPIRY)]
    return dt.datetime.fromisoformat(line[len(EXPIRY):].replace("Z", "+00:00"))


def validate_manifests(text: str) -> list[dict]:
    """Every YAML document validated (strictly: no unknown fields) against the pinned
    release's schemas; returns the documents."""
    import kubernetes_validate

    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    assert docs, "no Kubernetes objects"
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_RELEASE, strict=True)
    return docs


def required_node_terms(doc: dict) -> list[dict]:
    """matchExpressions of a PV's or a Job's required node affinity."""
    if doc["kind"] == "PersistentVolume":
        terms = doc["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    else:
        terms = doc["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [e for term in terms for e in term["matchExpressions"]]


def node_matches(labels: dict[str, str], expressions: list[dict]) -> bool:
    """Whether a node with `labels` satisfies every expression (In / Exists only)."""
    for e in expressions:
        if e["operator"] == "In":
            if labels.get(e["key"]) not in e["values"]:
                return False
        elif e["operator"] == "Exists":
            if e["key"] not in labels:
                return False
        else:
            raise AssertionError(f"operator {e['operator']} not modelled here")
    return True
