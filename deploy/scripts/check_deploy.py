#!/usr/bin/env python3
"""Checks for deploy/: the Helm chart, the plain manifests and the Dockerfile, against each other
and against what the workspace actually builds and the daemon actually reads.

Run through deploy/scripts/check.sh (which provides helm, kubernetes-validate and the daemon's
--help/--list-env output). Ends with "deploy: N passed, N failed"; exit status 1 on any failure.
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

import kubernetes_validate
import yaml

# Kubernetes versions the renderings must validate against: the newest schema set shipped by
# kubernetes-validate and the chart's minimum (Chart.yaml kubeVersion).
KUBE_VERSIONS = [kubernetes_validate.latest_version(), "1.25.0"]
RELEASE, NAMESPACE = "istio-cni", "istio-system"
# Env vars the chart sets ahead of the daemon (the repair controller and the ambient node agent
# are being added to install-cni): tolerated with a warning while `install-cni --list-env` does
# not print them.
PENDING_ENV = re.compile(r"^(REPAIR_[A-Z_]+|KUBERNETES_NODE_NAME|AMBIENT_[A-Z0-9_]+|ENABLE_AMBIENT_DETECTION_RETRY"
                         r"|ZTUNNEL_UDS_ADDRESS)$")
# Istio's istio-cni chart (manifests/charts/istio-cni/values.yaml, `ambient:` and `cniNetnsDir`):
# the same names and defaults here.
ISTIO_AMBIENT_DEFAULTS = {
    "enabled": False,
    "enablementSelectors": [
        {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
        {"podSelector": {"matchExpressions": [{"key": "istio.io/dataplane-mode", "operator": "NotIn",
                                               "values": ["none"]}]},
         "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
    ],
    "dnsCapture": True,
    "ipv6": True,
    "reconcileIptablesOnStartup": True,
    "enableAmbientDetectionRetry": False,
}
ISTIO_NETNS_DIR = "/var/run/netns"
# ambient.enabled: the ConfigMap key of each ambient value (Istio's configmap-cni.yaml).
AMBIENT_ENV = {
    "enabled": "AMBIENT_ENABLED",
    "dnsCapture": "AMBIENT_DNS_CAPTURE",
    "ipv6": "AMBIENT_IPV6",
    "reconcileIptablesOnStartup": "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP",
    "enableAmbientDetectionRetry": "ENABLE_AMBIENT_DETECTION_RETRY",
}
# The socket the node agent serves for ztunnel (Istio's default; ztunnel's chart mounts the same
# host directory).
ZTUNNEL_UDS = "/var/run/ztunnel/ztunnel.sock"
# Plugin self-bypass prefix (crates/pod-policy/src/bypass.rs SELF_POD_PREFIX).
SELF_POD_PREFIX = "istio-cni-node-"

# Variants rendered besides the defaults: name -> (values, expectations).
VARIANTS = {
    "default": {},
    # repair off, reconcile on (its default): list/watch, events, pod-netns entry stay.
    "repair-off": {"repair": {"enabled": False}},
    "repair-off-nft": {"repair": {"enabled": False}, "redirectBackend": "nft"},
    "delete-pods": {"repair": {"repairPods": False, "deletePods": True}},
    "label-pods": {"repair": {"repairPods": False, "labelPods": True}},
    "reconcile-off": {"reconcile": {"enabled": False}},
    "repair-off-reconcile-off": {"repair": {"enabled": False}, "reconcile": {"enabled": False}},
    "repair-off-nft-reconcile-off": {"repair": {"enabled": False}, "reconcile": {"enabled": False},
                                     "redirectBackend": "nft"},
    "delete-pods-reconcile-off": {"repair": {"repairPods": False, "deletePods": True},
                                  "reconcile": {"enabled": False}},
    "reconcile-interval": {"reconcile": {"interval": "1m30s"}},
    "taint": {"taint": {"enabled": True}},
    "controller-mode": {"controllerMode": {"enabled": True}},
    "ambient": {"ambient": {"enabled": True}},
    # With "ambient" and "custom", every ambient bool has its own pattern across the three, so two
    # settings swapped in the ConfigMap are caught.
    "ambient-ipv4": {"ambient": {"enabled": True, "ipv6": False, "reconcileIptablesOnStartup": False}},
    # ambient alone: list/watch pods, the pod-netns capabilities and /proc come from ambient only.
    "ambient-only": {"ambient": {"enabled": True}, "repair": {"enabled": False}, "reconcile": {"enabled": False},
                     "redirectBackend": "nft"},
    # ambient values changed but ambient off: nothing of ambient may be rendered.
    "ambient-off-customised": {"cniNetnsDir": "/var/run/docker/netns",
                               "ambient": {"dnsCapture": False, "enableAmbientDetectionRetry": True,
                                           "enablementSelectors": []}},
    "custom": {
        "hub": "registry.example.com/mesh",
        "tag": "1.2.3",
        "pullPolicy": "Always",
        "logLevel": "debug",
        "excludeNamespaces": ["kube-system", "monitoring"],
        "cniBinDir": "/home/kubernetes/bin",
        "cniConfDir": "/etc/cni/custom.d",
        "cniConfFileName": "10-calico.conflist",
        "chained": False,
        "psp_cluster_role": "psp:privileged",
        "redirectBackend": "iptables-legacy",
        "repair": {"repairPods": False, "deletePods": True, "labelPods": True,
                   "labelSelectors": "app=x", "fieldSelectors": "status.phase=Running",
                   "initContainerExitCode": 0},
        "cniNetnsDir": "/var/run/docker/netns",
        "ambient": {"enabled": True, "dnsCapture": False, "ipv6": True, "reconcileIptablesOnStartup": False,
                    "enableAmbientDetectionRetry": True,
                    "enablementSelectors": [
                        {"namespaceSelector": {"matchLabels": {"mesh": "ambient"}},
                         "podSelector": {"matchExpressions": [{"key": "kubevirt.io", "operator": "DoesNotExist"},
                                                              {"key": "tier", "operator": "In",
                                                               "values": ["web", "api"]}]}},
                        {"podSelector": {}}]},
        "monitoringPort": 9090,
        "resources": {"limits": {"memory": "64Mi"}},
        "nodeSelector": {"mesh.example.com/pool": "a"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    },
}
# Values the chart must refuse (values.schema.json).
BAD_VALUES = {
    "logLevel=trace": {"logLevel": "trace"},
    "redirectBackend=iptables": {"redirectBackend": "iptables"},
    "unknown key": {"cniBinDirs": "/x"},
    "monitoringPort=health port": {"monitoringPort": 8000},
    "reconcile.interval=5 minutes": {"reconcile": {"interval": "5 minutes"}},
    "reconcile.interval number": {"reconcile": {"interval": 300}},
    "reconcile unknown key": {"reconcile": {"period": "5m"}},
    "controllerMode.enabled string": {"controllerMode": {"enabled": "yes"}},
    "taint.key with a space": {"taint": {"enabled": True, "key": "not ready"}},
    "ambient.enabled string": {"ambient": {"enabled": "true"}},
    "ambient.dnsCapture string": {"ambient": {"dnsCapture": "false"}},
    "ambient.ipv6 number": {"ambient": {"ipv6": 1}},
    "ambient.reconcileIptablesOnStartup string": {"ambient": {"reconcileIptablesOnStartup": "yes"}},
    "ambient.enableAmbientDetectionRetry string": {"ambient": {"enableAmbientDetectionRetry": "no"}},
    "ambient unknown key (Istio's removed redirectMode)": {"ambient": {"redirectMode": "iptables"}},
    "ambient.enablementSelectors not a list": {"ambient": {"enablementSelectors": {"podSelector": {}}}},
    "ambient.enablementSelectors unknown selector key": {"ambient": {"enablementSelectors": [{"nodeSelector": {}}]}},
    "ambient.enablementSelectors matchExpression (typo)": {"ambient": {"enablementSelectors": [
        {"podSelector": {"matchExpression": [{"key": "a", "operator": "Exists"}]}}]}},
    "ambient.enablementSelectors operator Equals": {"ambient": {"enablementSelectors": [
        {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]}}]}},
    "ambient.enablementSelectors NotIn without values": {"ambient": {"enablementSelectors": [
        {"podSelector": {"matchExpressions": [{"key": "a", "operator": "NotIn"}]}}]}},
    "ambient.enablementSelectors Exists with values": {"ambient": {"enablementSelectors": [
        {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["b"]}]}}]}},
    "ambient.enablementSelectors matchLabels value a number": {"ambient": {"enablementSelectors": [
        {"namespaceSelector": {"matchLabels": {"a": 1}}}]}},
    "cniNetnsDir relative": {"cniNetnsDir": "var/run/netns"},
}

results = []


def check(name, ok, detail=""):
    results.append((name, bool(ok)))
    print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"\n      {detail}" if detail and not ok else ""))
    return ok


def warn(msg):
    print(f"WARN  {msg}")


def merge(base, over):
    out = dict(base)
    for k, v in over.items():
        # Helm coalesces maps key by key (an empty map clears nothing), lists and scalars replace.
        out[k] = merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def helm_template(helm, chart, values=None):
    cmd = [helm, "template", RELEASE, chart, "--namespace", NAMESPACE]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        if values is not None:
            yaml.safe_dump(values, f)
            f.flush()
            cmd += ["-f", f.name]
        p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def docs_of(text):
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(docs, kind, name=None):
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def value_paths(values, templates_text, prefix=""):
    """Leaf value paths; a map referenced as a whole in a template (`.Values.resources`) is one
    leaf, otherwise its keys are."""
    out = []
    for k, v in values.items():
        p = f"{prefix}{k}"
        whole = re.search(r"\.Values\." + re.escape(p) + r"(?![\w.])", templates_text)
        if isinstance(v, dict) and v and not whole:
            out += value_paths(v, templates_text, p + ".")
        else:
            out.append(p)
    return out


def parse_help(text):
    """{ENV: default} from clap's --help (`[env: X=]` followed by `[default: Y]`)."""
    defaults, env = {}, None
    for line in text.splitlines():
        m = re.search(r"\[env: ([A-Z0-9_]+)=", line)
        if m:
            env = m.group(1)
            continue
        m = re.search(r"\[default: (.*)\]\s*$", line)
        if m and env:
            d = m.group(1)
            defaults[env] = "" if d == '""' else d
            env = None
    return defaults


def parse_dockerfile(text):
    """(stages, final-stage COPY pairs (with or without --from), final ENTRYPOINT, cargo --bin names)."""
    text = re.sub(r"\\\n", " ", text)
    stages, copies, entry, cargo_bins = [], [], None, []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        word = s.split()[0].upper()
        if word == "FROM":
            stages.append(s)
            copies.clear()
            entry = None
        elif word == "COPY":
            parts = [p for p in shlex.split(s)[1:] if not p.startswith("--")]
            copies.append((parts[0], parts[1]))
        elif word == "ENTRYPOINT":
            entry = json.loads(s[len("ENTRYPOINT"):].strip())
        elif word == "RUN" and "cargo build" in s:
            cargo_bins += re.findall(r"--bin\s+([\w-]+)", s)
    return stages, list(copies), entry, cargo_bins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--helm", required=True)
    ap.add_argument("--help-text", required=True, help="file: install-cni --help")
    ap.add_argument("--list-env", required=True, help="file: install-cni --list-env")
    ap.add_argument("--cargo-metadata", required=True, help="file: cargo metadata --no-deps")
    a = ap.parse_args()
    repo = a.repo
    chart = os.path.join(repo, "deploy/helm/istio-cni")
    read = lambda p: open(os.path.join(repo, p)).read()  # noqa: E731

    values = yaml.safe_load(read("deploy/helm/istio-cni/values.yaml"))
    chart_meta = yaml.safe_load(read("deploy/helm/istio-cni/Chart.yaml"))
    schema = json.loads(read("deploy/helm/istio-cni/values.schema.json"))
    readme = read("deploy/helm/istio-cni/README.md")
    tdir = os.path.join(chart, "templates")
    templates = "\n".join(open(os.path.join(tdir, f)).read() for f in sorted(os.listdir(tdir)))
    daemon_env = set(open(a.list_env).read().split())
    daemon_defaults = parse_help(open(a.help_text).read())
    meta = json.load(open(a.cargo_metadata))
    ws_bins = {t["name"] for p in meta["packages"] for t in p["targets"] if "bin" in t["kind"]}
    ws_version = {p["name"]: p["version"] for p in meta["packages"]}["install-cni"]

    # --- renderings -------------------------------------------------------------------------
    rendered = {}
    for name, over in VARIANTS.items():
        rc, out, err = helm_template(a.helm, chart, over if over else None)
        if check(f"helm template renders variant {name}", rc == 0, err.strip()):
            rendered[name] = (merge(values, over), docs_of(out), out)
    for name, over in BAD_VALUES.items():
        rc, _, err = helm_template(a.helm, chart, over)
        check(f"chart refuses {name}", rc != 0 and "schema" in err.lower(), f"rc={rc} {err.strip()[:200]}")

    manifest_text = read("deploy/manifests/istio-cni.yaml")
    manifest_body = re.sub(r"\A(#[^\n]*\n)+", "", manifest_text)
    if "default" in rendered:
        check("deploy/manifests/istio-cni.yaml is the chart's default rendering (deploy/scripts/render.sh)",
              manifest_body == rendered["default"][2],
              "out of date: run deploy/scripts/render.sh")
    manifest_docs = docs_of(manifest_text)
    ambient_text = read("deploy/manifests/istio-cni-ambient.yaml")
    if "ambient" in rendered:
        check("deploy/manifests/istio-cni-ambient.yaml is the rendering with ambient.enabled=true (deploy/scripts/render.sh)",
              re.sub(r"\A(#[^\n]*\n)+", "", ambient_text) == rendered["ambient"][2],
              "out of date: run deploy/scripts/render.sh")

    # --- (1) Kubernetes schemas -------------------------------------------------------------
    sets = [("manifests/istio-cni.yaml", manifest_docs),
            ("manifests/istio-cni-ambient.yaml", docs_of(ambient_text))] + [(f"rendering {n}", r[1]) for n, r in rendered.items()]
    for kv in KUBE_VERSIONS:
        for label, docs in sets:
            errs = []
            for d in docs:
                try:
                    kubernetes_validate.validate(d, kv, strict=True)
                except Exception as e:  # ValidationError, SchemaNotFoundError, ...
                    errs.append(f"{d.get('kind')}/{d['metadata'].get('name')}: {str(e)[:300]}")
            check(f"{label}: {len(docs)} objects valid for Kubernetes {kv} (strict)", docs and not errs, "; ".join(errs))
    broken = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "x"},
              "spec": {"selector": {}, "templat": {}}}
    try:
        kubernetes_validate.validate(broken, KUBE_VERSIONS[0], strict=True)
        check("negative control: validator rejects a misspelt DaemonSet field", False)
    except kubernetes_validate.ValidationError:
        check("negative control: validator rejects a misspelt DaemonSet field", True)

    # --- (2) values: used, documented, in the schema ----------------------------------------
    paths = value_paths(values, templates)
    unused = [p for p in paths if not re.search(r"\.Values\." + re.escape(p) + r"(?![\w])", templates)]
    check(f"every value ({len(paths)}) is used by a template", not unused, f"unused: {unused}")
    rows = {}
    for line in readme.splitlines():
        m = re.match(r"^\|\s*`([\w.]+)`\s*\|\s*`(.*?)`\s*\|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    undocumented = [p for p in paths if p not in rows]
    check("every value is documented in the chart README", not undocumented, f"missing: {undocumented}")
    stray = [r for r in rows if r not in paths]
    check("the chart README documents no value that does not exist", not stray, f"stray: {stray}")

    def get(d, p):
        for k in p.split("."):
            d = d[k]
        return d
    wrong = [f"{p}: README `{rows[p]}` vs values {get(values, p)!r}" for p in paths
             if p in rows and yaml.safe_load(rows[p]) != get(values, p)]
    check("README defaults equal values.yaml", not wrong, "; ".join(wrong))

    def schema_keys(s, prefix=""):
        out = set()
        for k, v in s.get("properties", {}).items():
            out.add(prefix + k)
            out |= schema_keys(v, prefix + k + ".")
        return out

    def value_keys(v, prefix=""):
        out = set()
        for k, x in v.items():
            out.add(prefix + k)
            if isinstance(x, dict) and k in ("repair", "reconcile", "taint", "controllerMode", "ambient"):
                out |= value_keys(x, prefix + k + ".")
        return out
    check("values.schema.json describes exactly the keys of values.yaml",
          schema_keys(schema) == value_keys(values),
          f"schema only: {schema_keys(schema) - value_keys(values)}, values only: {value_keys(values) - schema_keys(schema)}")
    issue_values = {"hub", "tag", "pullPolicy", "logLevel", "excludeNamespaces", "cniBinDir", "cniConfDir",
                    "cniConfFileName", "chained", "psp_cluster_role", "redirectBackend", "repair",
                    "monitoringPort", "resources", "nodeSelector", "tolerations", "reconcile"}
    check("values.yaml has every value of the issue's table", issue_values <= set(values),
          f"missing: {issue_values - set(values)}")
    check("reconcile defaults equal the daemon's (RECONCILE_ENABLED, RECONCILE_INTERVAL)",
          str(values["reconcile"]["enabled"]).lower() == daemon_defaults.get("RECONCILE_ENABLED")
          and values["reconcile"]["interval"] == daemon_defaults.get("RECONCILE_INTERVAL"),
          f"{values['reconcile']} vs {daemon_defaults.get('RECONCILE_ENABLED')} {daemon_defaults.get('RECONCILE_INTERVAL')}")
    check("ambient values: Istio's names and defaults (ambient.*, cniNetnsDir)",
          values.get("ambient") == ISTIO_AMBIENT_DEFAULTS and values.get("cniNetnsDir") == ISTIO_NETNS_DIR,
          f"{values.get('ambient')} {values.get('cniNetnsDir')}")
    seeds = {"logLevel": "warn", "excludeNamespaces": ["istio-system", "kube-system"], "cniBinDir": "/opt/cni/bin",
             "cniConfDir": "/etc/cni/net.d", "cniConfFileName": "", "chained": True, "redirectBackend": "auto"}
    check("seed defaults kept", all(values.get(k) == v for k, v in seeds.items()),
          str({k: values.get(k) for k in seeds}))
    check("Chart version == appVersion == tag == workspace version",
          chart_meta["version"] == str(chart_meta["appVersion"]) == str(values["tag"]) == ws_version,
          f"{chart_meta['version']} {chart_meta['appVersion']} {values['tag']} {ws_version}")

    # --- per rendering: env (3), mounts/ports (4), RBAC, security, shape ---------------------
    for name, (vals, docs, _) in rendered.items():
        ds = by_kind(docs, "DaemonSet")
        cms = by_kind(docs, "ConfigMap")
        if not check(f"[{name}] one DaemonSet, one ConfigMap", len(ds) == 1 and len(cms) == 1):
            continue
        ds, cm = ds[0], cms[0]
        pod = ds["spec"]["template"]
        spec = pod["spec"]
        ctr = next(c for c in spec["containers"] if c["name"] == "install-cni")
        data = cm.get("data") or {}
        env_names = [e["name"] for e in ctr.get("env", [])]
        refs = [r["configMapRef"]["name"] for r in ctr.get("envFrom", []) if "configMapRef" in r]
        check(f"[{name}] DaemonSet takes the daemon env from ConfigMap {cm['metadata']['name']}",
              refs == [cm["metadata"]["name"]])
        set_env = set(data) | set(env_names)
        unknown = sorted(e for e in set_env if e not in daemon_env)
        pending = [e for e in unknown if PENDING_ENV.match(e)]
        if pending:
            warn(f"[{name}] not read by this install-cni build yet (repair controller / ambient agent pending): {pending}")
        bad = [e for e in unknown if not PENDING_ENV.match(e)]
        check(f"[{name}] every env var set ({len(set_env)}) is one install-cni reads", not bad, f"unknown: {bad}")
        check(f"[{name}] no env var set twice", len(env_names) == len(set(env_names)) and not set(data) & set(env_names))
        for b in [k for k, v in data.items() if k in ("CHAINED_CNI_PLUGIN", "REPAIR_ENABLED", "REPAIR_REPAIR_PODS",
                                                      "REPAIR_DELETE_PODS", "REPAIR_LABEL_PODS", "RECONCILE_ENABLED",
                                                      "CONTROLLER_MODE", *AMBIENT_ENV.values())]:
            check(f"[{name}] {b}={data[b]} is a bool the daemon parses", data[b] in ("true", "false"))
        check(f"[{name}] CONTROLLER_MODE is set exactly when controllerMode.enabled",
              data.get("CONTROLLER_MODE") == ("true" if vals["controllerMode"]["enabled"] else None),
              str(data.get("CONTROLLER_MODE")))
        check(f"[{name}] NODE_TAINT_KEY is taint.key exactly when taint.enabled",
              data.get("NODE_TAINT_KEY") == (vals["taint"]["key"] if vals["taint"]["enabled"] else None)
              and "KUBERNETES_NODE_NAME" in env_names, str(data.get("NODE_TAINT_KEY")))
        check(f"[{name}] values reach the daemon",
              data.get("PLUGIN_LOG_LEVEL") == vals["logLevel"]
              and data.get("EXCLUDE_NAMESPACES") == ",".join(vals["excludeNamespaces"])
              and data.get("REDIRECT_BACKEND") == vals["redirectBackend"]
              and data.get("CNI_CONF_NAME") == (vals["cniConfFileName"] or "")
              and data.get("CHAINED_CNI_PLUGIN") == str(vals["chained"]).lower()
              and data.get("REPAIR_ENABLED") == str(vals["repair"]["enabled"]).lower()
              and data.get("RECONCILE_ENABLED") == str(vals["reconcile"]["enabled"]).lower()
              and data.get("RECONCILE_INTERVAL", vals["reconcile"]["interval"]) == vals["reconcile"]["interval"], str(data))
        ambient = vals["ambient"]["enabled"]
        amb = vals["ambient"]
        if ambient:
            want_env = {AMBIENT_ENV[k]: str(amb[k]).lower() for k in AMBIENT_ENV}
            want_env["ZTUNNEL_UDS_ADDRESS"] = ZTUNNEL_UDS
            got_env = {k: data.get(k) for k in want_env}
            check(f"[{name}] ambient values reach the daemon (AMBIENT_*, ENABLE_AMBIENT_DETECTION_RETRY, "
                  f"ZTUNNEL_UDS_ADDRESS)", got_env == want_env, f"got {got_env} want {want_env}")
            sel_text = data.get("AMBIENT_ENABLEMENT_SELECTOR")
            try:
                sel = yaml.safe_load(sel_text) if isinstance(sel_text, str) else None
            except yaml.YAMLError as e:
                sel = f"unparsable: {e}"
            check(f"[{name}] AMBIENT_ENABLEMENT_SELECTOR is YAML text of ambient.enablementSelectors "
                  f"({len(amb['enablementSelectors'])} selectors)",
                  sel == amb["enablementSelectors"], f"{sel_text!r} -> {sel!r}")
        else:
            leaked = sorted(k for k in data if k != "AMBIENT_ENABLED"
                            and (k.startswith("AMBIENT_") or k in ("ENABLE_AMBIENT_DETECTION_RETRY", "ZTUNNEL_UDS_ADDRESS")))
            check(f"[{name}] AMBIENT_ENABLED=false and no other ambient setting",
                  data.get("AMBIENT_ENABLED") == "false" and not leaked, f"{data.get('AMBIENT_ENABLED')} {leaked}")
        fields = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in ctr.get("env", [])}
        check(f"[{name}] POD_NAMESPACE/KUBERNETES_NODE_NAME from the downward API",
              fields.get("POD_NAMESPACE") == "metadata.namespace" and fields.get("KUBERNETES_NODE_NAME") == "spec.nodeName")
        reconcile = vals["reconcile"]["enabled"]
        if vals["repair"]["enabled"] or reconcile or ambient:
            check(f"[{name}] REPAIR_NODE_NAME from spec.nodeName", fields.get("REPAIR_NODE_NAME") == "spec.nodeName")

        eff = dict(daemon_defaults)
        eff.update(data)
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        mounts = {m["mountPath"].rstrip("/"): m for m in ctr.get("volumeMounts", [])}

        def host_of(path):
            m = mounts.get(path.rstrip("/"))
            return m and vols[m["name"]].get("hostPath", {}).get("path")
        used_mounts = set()

        def mounted(label, path, host, ro=None):
            used_mounts.add(path.rstrip("/"))
            ok = host_of(path) == host and (ro is None or bool(mounts[path.rstrip("/")].get("readOnly")) == ro)
            check(f"[{name}] {label}: {path} <- host {host}", ok, f"found host {host_of(path)}")
        mounted("MOUNTED_CNI_NET_DIR", eff["MOUNTED_CNI_NET_DIR"], vals["cniConfDir"])
        for t in [x for x in eff["CNI_BIN_TARGET_DIRS"].split(",") if x.strip()]:
            mounted("CNI_BIN_TARGET_DIRS", t.strip(), vals["cniBinDir"])
        # The plugin runs on the host and reads cni_agent_run_dir as written by the daemon.
        mounted("CNI_AGENT_RUN_DIR (same path on host)", eff["CNI_AGENT_RUN_DIR"], eff["CNI_AGENT_RUN_DIR"])
        repair_mode = ""
        if vals["repair"]["enabled"]:
            repair_mode = next((m for m, k in (("repair", "repairPods"), ("delete", "deletePods"), ("label", "labelPods"))
                                if vals["repair"][k]), "")
        # repairPods, the reconcile and the ambient agent enter pods' network namespaces through
        # the host's /proc.
        enter_pod_netns = repair_mode == "repair" or reconcile or ambient
        if enter_pod_netns:
            mounted("repair proc root", eff.get("REPAIR_PROC_ROOT", "/host/proc"), "/proc", ro=True)
        if ambient:
            # The plugin hands the agent the netns path as the runtime gave it: same path inside.
            netns = vals["cniNetnsDir"]
            mounted("pod netns dir (same path as on the host, cniNetnsDir)", netns, netns, ro=True)
            uds_dir = os.path.dirname(eff["ZTUNNEL_UDS_ADDRESS"])
            mounted("ZTUNNEL_UDS_ADDRESS dir (same path as on the host)", uds_dir, "/var/run/ztunnel", ro=False)
            nm = mounts.get(netns.rstrip("/"), {})
            check(f"[{name}] pod netns dir mountPropagation HostToContainer (netns created after start are seen)",
                  nm.get("mountPropagation") == "HostToContainer", str(nm))
            types = {p: vols[mounts[p]["name"]]["hostPath"].get("type") for p in (netns.rstrip("/"), uds_dir)
                     if p in mounts}
            check(f"[{name}] netns and ztunnel dirs are hostPath DirectoryOrCreate", list(types.values()) ==
                  ["DirectoryOrCreate"] * 2, str(types))
            # pluginevent.sock (plugin -> agent) lives in the run dir the plugin reads on the host.
            check(f"[{name}] pluginevent.sock dir CNI_AGENT_RUN_DIR is mounted read-write",
                  not mounts.get(eff["CNI_AGENT_RUN_DIR"].rstrip("/"), {}).get("readOnly"))
        # The legacy host probe rule waits for the node's xtables lock (kubelet's, kube-proxy's).
        if ambient and vals["redirectBackend"] != "nftables":
            mounted("the node's xtables lock", "/run/xtables.lock", "/run/xtables.lock", ro=False)
            lock = vols.get(mounts.get("/run/xtables.lock", {}).get("name"), {})
            check(f"[{name}] xtables lock is hostPath FileOrCreate",
                  lock.get("hostPath", {}).get("type") == "FileOrCreate", str(lock))
        check(f"[{name}] no mount beyond those", set(mounts) == used_mounts, f"extra: {set(mounts) - used_mounts}")
        check(f"[{name}] hostPath volumes only for the mounts", set(vols) == {m["name"] for m in mounts.values()})
        check(f"[{name}] SERVICE_ACCOUNT_DIR is the automounted token dir",
              eff["SERVICE_ACCOUNT_DIR"] == "/var/run/secrets/kubernetes.io/serviceaccount"
              and spec.get("automountServiceAccountToken", True) is not False
              and "/var/run/secrets/kubernetes.io/serviceaccount" not in mounts)

        ports = {p["name"]: p["containerPort"] for p in ctr.get("ports", [])}
        rp = ctr.get("readinessProbe", {}).get("httpGet", {})
        check(f"[{name}] readinessProbe /readyz on HEALTH_PORT {eff['HEALTH_PORT']}",
              rp.get("path") == "/readyz" and str(rp.get("port")) == eff["HEALTH_PORT"] == "8000"
              and str(ports.get("health")) == eff["HEALTH_PORT"], str(rp))
        ann = pod["metadata"].get("annotations", {})
        check(f"[{name}] metrics port {eff['MONITORING_PORT']} annotated for Prometheus",
              str(ports.get("metrics")) == eff["MONITORING_PORT"] == str(vals["monitoringPort"])
              and ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == eff["MONITORING_PORT"]
              and ann.get("prometheus.io/path") == "/metrics", str(ann))
        check(f"[{name}] image {vals['hub']}/install-cni:{vals['tag']} ({vals['pullPolicy']})",
              ctr["image"] == f"{vals['hub']}/install-cni:{vals['tag']}" and ctr["imagePullPolicy"] == vals["pullPolicy"])

        # shape
        upd = ds["spec"].get("updateStrategy", {})
        check(f"[{name}] DaemonSet shape (name, priority class, sidecar.istio.io/inject, rolling update, grace)",
              ds["metadata"]["name"] + "-" == SELF_POD_PREFIX
              and ds["metadata"]["namespace"] == NAMESPACE
              and spec.get("priorityClassName") == "system-node-critical"
              and ann.get("sidecar.istio.io/inject") == "false"
              and upd.get("type") == "RollingUpdate" and upd.get("rollingUpdate", {}).get("maxUnavailable") == 1
              and isinstance(spec.get("terminationGracePeriodSeconds"), int)
              and spec.get("serviceAccountName") == "istio-cni"
              and spec.get("hostNetwork") is True)
        check(f"[{name}] tolerations/nodeSelector/resources from values",
              spec.get("tolerations", []) == vals["tolerations"] and spec.get("nodeSelector", {}) == vals["nodeSelector"]
              and ctr.get("resources", {}) == vals["resources"])
        if name == "default":
            check("[default] tolerates every taint", {"operator": "Exists"} in spec.get("tolerations", []))

        # security: capabilities follow the configuration
        sc = ctr.get("securityContext", {})
        caps = set(sc.get("capabilities", {}).get("add", []))
        want = set()
        if vals["redirectBackend"] == "auto" or enter_pod_netns:
            want.add("NET_ADMIN")
        if enter_pod_netns:
            want |= {"SYS_ADMIN", "SYS_PTRACE"}
        # The image's iptables-legacy tools use raw sockets, where the node may be legacy.
        if vals["redirectBackend"] != "nftables" and (vals["redirectBackend"] == "auto" or enter_pod_netns):
            want.add("NET_RAW")
        check(f"[{name}] capabilities exactly {sorted(want)}, all others dropped, not privileged",
              caps == want and sc.get("capabilities", {}).get("drop") == ["ALL"] and sc.get("privileged") is False
              and sc.get("readOnlyRootFilesystem") is True,
              f"add={sorted(caps)} sc={sc}")
        check(f"[{name}] allowPrivilegeEscalation=false unless SYS_ADMIN (which the API refuses with it)",
              sc.get("allowPrivilegeEscalation") is (None if "SYS_ADMIN" in caps else False))

        # RBAC
        roles = by_kind(docs, "ClusterRole", "istio-cni")
        perms = set()
        for r in (roles[0]["rules"] if roles else []):
            for g in r["apiGroups"]:
                for res in r["resources"]:
                    for v in r["verbs"]:
                        # a rule limited by resourceNames is a different (narrower) permission
                        perms.add((g, res, v) + ((",".join(sorted(r["resourceNames"])),) if r.get("resourceNames") else ()))
        # the plugin's pod GET; on SIGTERM the daemon's own DaemonSet (rollout vs uninstall), both modes
        want = {("", "pods", "get"), ("apps", "daemonsets", "get", ds["metadata"]["name"])}
        if vals["repair"]["enabled"] or reconcile or ambient:
            want |= {("", "pods", "list"), ("", "pods", "watch")}
        if repair_mode == "delete":
            want |= {("", "pods", "delete"), ("", "events", "create"), ("", "events", "patch")}
        if repair_mode == "label":
            want |= {("", "pods/status", "patch"), ("", "events", "create"), ("", "events", "patch")}
        if reconcile:  # RedirectRulesRepaired events
            want |= {("", "events", "create"), ("", "events", "patch")}
        if vals["taint"]["enabled"]:
            want |= {("", "nodes", "get"), ("", "nodes", "patch")}
        if vals["controllerMode"]["enabled"]:  # initialized annotation, namespace opt-in
            want |= {("", "pods", "patch"), ("", "namespaces", "get"), ("", "namespaces", "list"),
                     ("", "namespaces", "watch")}
        if ambient:  # redirection annotation (pods/status, as Istio), namespace selectors
            want |= {("", "pods/status", "patch"), ("", "namespaces", "get"), ("", "namespaces", "list"),
                     ("", "namespaces", "watch")}
        check(f"[{name}] ClusterRole least privilege (repair mode {repair_mode or 'off'}, "
              f"reconcile {reconcile}, taint {vals['taint']['enabled']}, ambient {ambient})", perms == want,
              f"extra {sorted(perms - want)} missing {sorted(want - perms)}")
        crbs = {b["metadata"]["name"]: b for b in by_kind(docs, "ClusterRoleBinding")}
        sa_subject = [{"kind": "ServiceAccount", "name": "istio-cni", "namespace": NAMESPACE}]
        ok = "istio-cni" in crbs and crbs["istio-cni"]["roleRef"]["name"] == "istio-cni" \
            and crbs["istio-cni"]["subjects"] == sa_subject and by_kind(docs, "ServiceAccount", "istio-cni")
        if vals["psp_cluster_role"]:
            ok = ok and crbs.get("istio-cni-psp", {}).get("roleRef", {}).get("name") == vals["psp_cluster_role"] \
                and crbs["istio-cni-psp"]["subjects"] == sa_subject
        else:
            ok = ok and "istio-cni-psp" not in crbs
        check(f"[{name}] ServiceAccount + ClusterRoleBinding(s) (psp_cluster_role={vals['psp_cluster_role']!r})", ok)

    # --- (5) Dockerfiles vs workspace binaries ----------------------------------------------
    # deploy/Dockerfile packs the release binaries build-image.sh copies into its context's bin/;
    # deploy/Dockerfile.source builds them in a builder stage (machines with a registry). Both
    # also copy one root tree of Debian's iptables-legacy tools (stage-legacy-tools.sh) to /.
    cargo_cfg = read(".cargo/config.toml")
    triple = re.search(r'^target\s*=\s*"([^"]+)"', cargo_cfg, re.M).group(1)
    build_script = read("deploy/scripts/build-image.sh")
    script_bins = re.search(r"^BINS=\(([^)]*)\)", build_script, re.M).group(1).split()
    # THE build (integration/scripts/build-bins.sh: --workspace feature unification) is what
    # both images pack: build-image.sh runs it, Dockerfile.source runs it in its builder.
    bins_script = read("integration/scripts/build-bins.sh")
    built_bins = re.search(r"^BINS=\(([^)]*)\)", bins_script, re.M).group(1).split()
    check("build-bins.sh builds with --workspace (one feature unification)",
          re.search(r"^cargo build --locked --release --workspace ", bins_script, re.M) is not None)
    check(f"build-image.sh packs build-bins.sh's binaries ({sorted(built_bins)})",
          "integration/scripts/build-bins.sh" in build_script and sorted(script_bins) == sorted(built_bins),
          str(script_bins))
    check("build-image.sh stages the legacy tools into the context's legacy-tools/",
          'stage-legacy-tools.sh "$work/context/legacy-tools"' in build_script)
    source_text = read("deploy/Dockerfile.source")
    check("Dockerfile.source's builder runs build-bins.sh (no cargo build of its own)",
          re.search(r"^RUN integration/scripts/build-bins.sh\b", source_text, re.M) is not None
          and parse_dockerfile(source_text)[3] == [])
    check("Dockerfile.source's builder installs iptables and ipset and stages them into /legacy-tools",
          re.search(r"apt-get install[^&]*\biptables\b[^&]*\bipset\b", source_text, re.S) is not None
          and "deploy/scripts/stage-legacy-tools.sh /legacy-tools" in source_text)
    for dockerfile, prefix, built, tree in [
        ("deploy/Dockerfile", "bin/", script_bins, "legacy-tools/"),
        ("deploy/Dockerfile.source", f"/src/target/{triple}/release/", built_bins, "/legacy-tools/"),
    ]:
        stages, copies, entry, _ = parse_dockerfile(read(dockerfile))
        check(f"{dockerfile}: copies the legacy tools' tree {tree} to / once",
              [c for c in copies if c[1] == "/"] == [(tree, "/")], str(copies))
        copies = [c for c in copies if c[1] != "/"]
        srcs_ok = [s for s, _ in copies if s.startswith(prefix) and s[len(prefix):] in ws_bins]
        check(f"{dockerfile}: every other copied path ({len(copies)}) is a workspace bin target under {prefix}",
              copies and len(srcs_ok) == len(copies), f"copies={copies} bins={sorted(ws_bins)}")
        check(f"{dockerfile}: every binary it copies is one build-bins.sh builds",
              {s[len(prefix):] for s, _ in copies} <= set(built) <= ws_bins, f"built={built}")
        check(f"{dockerfile}: final stage is scratch (only the binaries and the legacy tools)",
              stages and stages[-1].split()[1] == "scratch")
        dests = {os.path.basename(d): d for _, d in copies}
        src_dir = daemon_defaults["CNI_BIN_SOURCE_DIR"].rstrip("/")
        plugin_bins = daemon_defaults["CNI_BINARIES"].split(",")
        check(f"{dockerfile}: CNI_BINARIES {plugin_bins} are in CNI_BIN_SOURCE_DIR {src_dir}",
              all(dests.get(b) == f"{src_dir}/{b}" for b in plugin_bins), str(dests))
        check(f"{dockerfile}: entrypoint is the copied install-cni",
              entry and entry[0] == dests.get("install-cni") == "/usr/local/bin/install-cni", str(entry))
        check(f"{dockerfile}: copies nothing else", set(dests) == set(plugin_bins) | {"install-cni"}, str(dests))

    passed = sum(ok for _, ok in results)
    failed = len(results) - passed
    print(f"deploy: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
