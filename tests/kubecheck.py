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


# --- Pod Security Standards -------------------------------------------------------------
# The "restricted" profile (which includes "baseline") as kubernetes.io/docs/concepts/
# security/pod-security-standards/ states it for the pinned release: each control its own
# check, over the pod spec of any object that carries one (Pod, Job, CronJob, Deployment,
# ...). Objects without a pod spec pass every control.

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
                         "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP",
                         "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
SELINUX_TYPES = {None, "container_t", "container_init_t", "container_kvm_t",
                 "container_engine_t"}


def pod_spec(doc: dict) -> dict | None:
    if doc["kind"] == "Pod":
        return doc["spec"]
    spec = doc.get("spec") or {}
    if doc["kind"] == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    return (spec.get("template") or {}).get("spec")


def _containers(pod: dict) -> list[dict]:
    return [*pod.get("containers", []), *pod.get("initContainers", []),
            *pod.get("ephemeralContainers", [])]


def _contexts(pod: dict) -> list[dict]:
    """The pod's security context and every container's (empty where unset)."""
    return [pod.get("securityContext") or {},
            *[c.get("securityContext") or {} for c in _containers(pod)]]


def _ok(pod, rule) -> list[str]:
    return [] if pod is None else rule(pod)


def host_process(pod) -> list[str]:
    return [f"windowsOptions.hostProcess in {c}" for c in _contexts(pod)
            if (c.get("windowsOptions") or {}).get("hostProcess")]


def host_namespaces(pod) -> list[str]:
    return [k for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]


def privileged(pod) -> list[str]:
    return [c["name"] for c in _containers(pod)
            if (c.get("securityContext") or {}).get("privileged")]


def host_path_volumes(pod) -> list[str]:
    return [v["name"] for v in pod.get("volumes", []) if "hostPath" in v]


def host_ports(pod) -> list[str]:
    return [f"{c['name']}:{p['hostPort']}" for c in _containers(pod)
            for p in c.get("ports", []) if p.get("hostPort")]


def apparmor(pod) -> list[str]:
    return [str(c["appArmorProfile"]) for c in _contexts(pod) if c.get("appArmorProfile")
            and c["appArmorProfile"].get("type") not in ("RuntimeDefault", "Localhost")]


def selinux(pod) -> list[str]:
    bad = []
    for c in _contexts(pod):
        opts = c.get("seLinuxOptions") or {}
        if opts.get("type") not in SELINUX_TYPES or opts.get("user") or opts.get("role"):
            bad.append(str(opts))
    return bad


def proc_mount(pod) -> list[str]:
    return [c["name"] for c in _containers(pod)
            if (c.get("securityContext") or {}).get("procMount", "Default") != "Default"]


def sysctls(pod) -> list[str]:
    return [s["name"] for s in (pod.get("securityContext") or {}).get("sysctls", [])
            if s["name"] not in SAFE_SYSCTLS]


def baseline_capabilities(pod) -> list[str]:
    return [cap for c in _containers(pod)
            for cap in ((c.get("securityContext") or {}).get("capabilities") or {}).get("add", [])
            if cap not in BASELINE_CAPABILITIES]


def volume_types(pod) -> list[str]:
    return [v["name"] for v in pod.get("volumes", [])
            if not set(v) - {"name"} <= RESTRICTED_VOLUMES]


def privilege_escalation(pod) -> list[str]:
    return [c["name"] for c in _containers(pod)
            if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False]


def run_as_non_root(pod) -> list[str]:
    pod_level = (pod.get("securityContext") or {}).get("runAsNonRoot")
    bad = [c["name"] for c in _containers(pod)
           if (c.get("securityContext") or {}).get("runAsNonRoot",
                                                   pod_level) is not True]
    return bad


def run_as_user(pod) -> list[str]:
    return [str(c) for c in _contexts(pod) if c.get("runAsUser") == 0]


def seccomp(pod) -> list[str]:
    pod_type = ((pod.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    bad = [] if pod_type in (None, "RuntimeDefault", "Localhost") else ["pod"]
    for c in _containers(pod):
        own = ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
        if own not in (None, "RuntimeDefault", "Localhost") or (own or pod_type) is None:
            bad.append(c["name"])
    return bad


def restricted_capabilities(pod) -> list[str]:
    bad = []
    for c in _containers(pod):
        caps = (c.get("securityContext") or {}).get("capabilities") or {}
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(c["name"])
    return bad


# control name -> check; each returns what violates it (empty: the control is met)
RESTRICTED = {
    "HostProcess": host_process, "Host Namespaces": host_namespaces,
    "Privileged Containers": privileged, "Capabilities (baseline)": baseline_capabilities,
    "HostPath Volumes": host_path_volumes, "Host Ports": host_ports, "AppArmor": apparmor,
    "SELinux": selinux, "/proc Mount Type": proc_mount, "Sysctls": sysctls,
    "Volume Types": volume_types, "Privilege Escalation": privilege_escalation,
    "Running as Non-root": run_as_non_root, "Running as Non-root user": run_as_user,
    "Seccomp": seccomp, "Capabilities (restricted)": restricted_capabilities,
}


def restricted_violations(doc: dict, control: str) -> list[str]:
    return _ok(pod_spec(doc), RESTRICTED[control])
