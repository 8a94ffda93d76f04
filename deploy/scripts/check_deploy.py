#!/usr/bin/env python3
"""Checks for deploy/: the Helm chart, the plain manifests and the Dockerfile, against each other
and against what the workspace actually builds and the daemon actually reads.

Run through deploy/scripts/check.sh (which provides helm, kubernetes-validate and the daemon's
--help/--list-env output). Ends with "deploy: N passed, N failed"; exit status 1 on any failure.
"""

import argparse
import functools
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
# PENDING_DAEMON_ENV: env vars the chart renders that the install-cni built alongside does not
# list yet (`install-cni --list-env`); the check warns when an entry is no longer needed. Empty:
# the daemon reads every one.
PENDING_DAEMON_ENV = set()
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
    "configDir": "",
    "shareHostNetworkNamespace": False,
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
        "image": "install-cni",
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
    # Istio's surface keeps its types
    "global.hub a number": {"global": {"hub": 1}},
    "cni.chained a string (cni. prefix typed as the key)": {"cni": {"chained": "yes"}},
    "cni.ambient.enabled a number": {"cni": {"ambient": {"enabled": 1}}},
    "platform=eks (unknown platform)": {"platform": "eks"},
    "global.platform=aks (unknown platform)": {"global": {"platform": "aks"}},
    "profile=minimal (no such istio-cni profile)": {"profile": "minimal"},
    "compatibilityVersion=1.24": {"compatibilityVersion": "1.24"},
    "compatibilityVersion a number": {"compatibilityVersion": 1.25},
    "global.resourceScope=some": {"global": {"resourceScope": "some"}},
    "provider=calico": {"provider": "calico"},
    "revision with capitals": {"revision": "Canary"},
    "seLinuxOptions unknown key": {"seLinuxOptions": {"typ": "spc_t"}},
    "seccompProfile type Default": {"seccompProfile": {"type": "Default"}},
    "logging.level=verbose": {"logging": {"level": "verbose"}},
    "global.logging.level scope without level": {"global": {"logging": {"level": "default"}}, "logging": {"level": "default:"}},
    "updateStrategy type Recreate": {"updateStrategy": {"type": "Recreate"}},
    "rollingMaxUnavailable=ten": {"rollingMaxUnavailable": "ten"},
    "terminationGracePeriodSeconds a string": {"terminationGracePeriodSeconds": "30"},
    "resourceQuotas.pods negative": {"resourceQuotas": {"pods": -1}},
    "podLabels value a number": {"podLabels": {"a": 1}},
    "env name with a space": {"env": {"MY VAR": "x"}},
    "env value a map": {"env": {"X": {"a": 1}}},
    "global.imagePullSecrets a string": {"global": {"imagePullSecrets": "corp"}},
    "useAppArmorAnnotation a string": {"useAppArmorAnnotation": "false"},
    "a key no Istio chart has": {"cniBinDirs": "/x"},
}
# Refused by the templates (a combination or a name the schema cannot see): name -> (values, words
# the error must contain).
BAD_COMBOS = {
    "global.nativeNftables with redirectBackend=iptables-legacy": (
        {"global": {"nativeNftables": True}, "redirectBackend": "iptables-legacy"}, ["global.nativeNftables", "iptables-legacy"]),
    "env replacing a downward-API variable": ({"env": {"POD_NAMESPACE": "x"}}, ["env.POD_NAMESPACE=x"]),
    "Istio's defaults. prefix": ({"defaults": {"hub": "x"}}, ["defaults.hub"]),
    "controllerMode without reconcile": ({"controllerMode": {"enabled": True}, "reconcile": {"enabled": False}},
                                         ["controllerMode.enabled needs reconcile.enabled"]),
}
# Istio values files (deploy/testdata/istio/values/): file -> extra helm args (both charts).
ISTIO_FILE_ARGS = {"gke.yaml": ["--kube-version", "v1.31.2-gke.1000"]}
# Istio's umbrella keys: values of Istio's other charts, accepted and ignored (NOTES.txt).
UMBRELLA = ["pilot", "gateways", "ztunnel", "telemetry", "sidecarInjectorWebhook", "istio_cni", "meshConfig",
            "base", "istiodRemote", "revisionTags", "defaultRevision", "experimental", "gatewayClasses",
            "trustedZtunnelNamespace", "configMap"]
# Keys the schema accepts that have no default (accepted and ignored, or Istio's prefixes).
ACCEPTED_ONLY = {"enabled", "privileged", "cni", "_internal_defaults_do_not_set", "defaults",
                 "repair.image", "repair.createEvents", *UMBRELLA}

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


def profile_of(chart, vals_user):
    """Istio's zzz_profile.yaml: the profile, compatibility-version and platform files merged."""
    prof = {}
    g = vals_user.get("global") or {}
    for kind, key in (("profile-%s", vals_user.get("profile") or g.get("profile")),
                      ("profile-compatibility-version-%s", vals_user.get("compatibilityVersion")),
                      ("profile-platform-%s", vals_user.get("platform") or g.get("platform"))):
        if key:
            prof = merge(prof, yaml.safe_load(open(os.path.join(chart, "files", (kind % key) + ".yaml"))) or {})
    return prof


def effective(defaults, chart, user):
    """The values the templates see: defaults < profile files < user values, then `cni.X` over `X`
    (Istio's zzz_profile.yaml + zzy_descope_legacy.yaml, re-implemented independently)."""
    v = merge(merge(defaults, profile_of(chart, user)), user)
    return merge(v, v.get("cni") or {})


def expected_image(v):
    if "/" in v["image"]:
        return v["image"]
    return f"{v['hub'] or v['global']['hub']}/{v['image'] or 'install-cni'}:{v['tag'] or v['global']['tag']}"


def expected_levels(v):
    """(LOG_LEVEL, PLUGIN_LOG_LEVEL) from logging.level / global.logging.level / logLevel."""
    daemon, plugin = v["logLevel"], None
    spec = v["logging"]["level"] or v["global"]["logging"]["level"]
    for part in [p.strip() for p in spec.split(",")] if spec else []:
        kv = part.split(":")
        if len(kv) == 1:
            daemon = kv[0]
        elif kv[0] == "default":
            daemon = kv[1]
        elif kv[0] == "cni-plugin":
            plugin = kv[1]
    fix = lambda x: "panic" if x == "none" else x  # noqa: E731
    return fix(daemon), fix(plugin or daemon)


def expected_backend(v):
    return "nft" if v["global"]["nativeNftables"] else v["redirectBackend"]


def expected_bin_dir(v, kube_version=""):
    return v["cniBinDir"] or ("/home/kubernetes/bin" if "-gke" in kube_version else "/opt/cni/bin")


def expected_strategy(v):
    st = json.loads(json.dumps(v["updateStrategy"]))
    if str(v.get("rollingMaxUnavailable", "")) != "" and st.get("type") == "RollingUpdate":
        st.setdefault("rollingUpdate", {})["maxUnavailable"] = v["rollingMaxUnavailable"]
    if st.get("type") == "OnDelete":
        st.pop("rollingUpdate", None)
    return st


def helm_notes(helm, chart, values_file=None, extra=()):
    """NOTES.txt as `helm install --dry-run=client` prints it (no cluster needed)."""
    cmd = [helm, "install", RELEASE, chart, "--namespace", NAMESPACE, "--dry-run=client", *extra]
    if values_file:
        cmd += ["-f", values_file]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout.split("\nNOTES:\n", 1)[-1] if "\nNOTES:\n" in p.stdout else "", p.stderr


def helm_template(helm, chart, values=None, extra=()):
    cmd = [helm, "template", RELEASE, chart, "--namespace", NAMESPACE, *extra]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        if values is not None:
            yaml.safe_dump(values, f)
            f.flush()
            cmd += ["-f", f.name]
        p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def helm_template_file(helm, chart, path, extra=()):
    p = subprocess.run([helm, "template", RELEASE, chart, "--namespace", NAMESPACE, "-f", path, *extra],
                       capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def docs_of(text):
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(docs, kind, name=None):
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def value_paths(values, schema, prefix=""):
    """Leaf value paths: a map whose schema lists its keys (ambient, repair, global, ...) is walked;
    a free-form map (resources, affinity, podLabels, env, ...) or one rendered whole
    (updateStrategy, seccompProfile, seLinuxOptions) is one leaf."""
    out = []
    for k, v in values.items():
        p = f"{prefix}{k}"
        sub = schema.get("properties", {}).get(k, {})
        if isinstance(v, dict) and v and sub.get("properties") and p not in ("updateStrategy", "seccompProfile", "seLinuxOptions"):
            out += value_paths(v, sub, p + ".")
        else:
            out.append(p)
    return out


def get_path(d, p):
    for k in p.split("."):
        d = d[k]
    return d


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


# --- docs/istio-compat.md beyond the chart values (sections B-G) ----------------------------
# The upstream names are pinned from Istio's source (deploy/testdata/istio/*.txt, at the chart's
# commit): every one needs a row with a status; a `same` row must still match our binary or code;
# a `still open` row must be in the "Still open" list.
COMPAT_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|([^|]*)\|\s*(same|differs on purpose: [^|]+|not applicable: [^|]+"
                        r"|still open)\s*\|")


def pinned_rows(path):
    """Tab-separated rows of a deploy/testdata/istio/*.txt file (comments and blanks skipped)."""
    return [line.rstrip("\n").split("\t") for line in open(path)
            if line.strip() and not line.startswith("#")]


def go_default(v):
    """A default as Go's code or clap's --help writes it, comparable: "" for empty, octal ints
    (0600, 0o600) as decimal."""
    v = v.strip()
    if v == '""':
        return ""
    m = re.fullmatch(r"0o?([0-7]+)", v)
    return str(int(m.group(1), 8)) if m else v


def compat_sections(text):
    """({section letter: {key: (second column, status)}}, duplicate keys, "Still open" text,
    {section letter: section text})."""
    rows, dups, texts, cur, open_text = {}, [], {}, None, ""
    for line in text.splitlines():
        if line.startswith("## "):
            m = re.match(r"^## ([B-G])\. ", line)
            cur = m.group(1) if m else ("open" if line.strip() == "## Still open" else None)
            if cur and cur != "open":
                rows[cur], texts[cur] = {}, ""
            continue
        if cur == "open":
            open_text += line + "\n"
        elif cur:
            texts[cur] += line + "\n"
            m = COMPAT_ROW.match(line)
            if m:
                if m.group(1) in rows[cur]:
                    dups.append(f"{cur}:{m.group(1)}")
                rows[cur][m.group(1)] = (m.group(2).strip(), m.group(3))
    return rows, dups, open_text, texts


def istio_compat_beyond_chart(repo, compat, daemon_env, help_text, daemon_defaults):
    tdir = os.path.join(repo, "deploy/testdata/istio")
    rows, dups, open_text, texts = compat_sections(compat)
    if not check("docs/istio-compat.md has sections B, C, D, E, F, G and a Still open list",
                 set(rows) == set("BCDEFG") and open_text.strip(), f"sections {sorted(rows)}"):
        return
    check("docs/istio-compat.md B-G: no key has two rows in one section", not dups, str(dups))
    for sec in "BCDEFG":
        counts = {}
        for _, status in rows[sec].values():
            s = status.split(":")[0]
            counts[s] = counts.get(s, 0) + 1
        print(f"INFO  docs/istio-compat.md section {sec}: {len(rows[sec])} rows "
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    # B: the daemon's environment and flags.
    env_rows = pinned_rows(os.path.join(tdir, "daemon-env.txt"))
    flag_rows = pinned_rows(os.path.join(tdir, "daemon-flags.txt"))
    istio_env = {r[0]: r[1] for r in env_rows}
    b = rows["B"]
    missing = [n for n in istio_env if n not in b]
    check(f"istio-compat B: every variable Istio's daemon reads or its chart sets ({len(istio_env)}, "
          f"daemon-env.txt) has a row with a status", not missing, f"missing: {missing}")
    missing = [r[0] for r in flag_rows if r[0] not in b]
    check(f"istio-compat B: every Istio flag/subcommand without a variable ({len(flag_rows)}, daemon-flags.txt) "
          f"has a row", not missing, f"missing: {missing}")
    both = sorted(daemon_env & set(istio_env))
    check(f"istio-compat B: every variable install-cni --list-env prints that Istio also has ({len(both)}) is marked",
          all(n in b for n in both), str([n for n in both if n not in b]))
    stray = [k for k in b if k not in istio_env and k not in {r[0] for r in flag_rows}]
    check("istio-compat B: every row names a pinned upstream setting", not stray, str(stray))
    bad = []
    for name, (_, status) in b.items():
        if status != "same":
            continue
        if name in istio_env:
            ours = daemon_defaults.get(name)
            if name not in daemon_env or ours is None or go_default(ours) != go_default(istio_env[name]):
                bad.append(f"{name}: Istio {istio_env[name]!r}, ours "
                           f"{'not listed' if name not in daemon_env else repr(ours)}")
        elif name.startswith("--") and not re.search(r"^\s*" + re.escape(name) + r"\b", help_text, re.M):
            bad.append(f"{name}: not in install-cni --help")
    check("istio-compat B: each `same` variable is one install-cni lists, with Istio's default "
          "(each `same` flag is in --help)", not bad, "; ".join(bad))
    for name, (_, status) in sorted(b.items()):
        if status == "still open" and name in daemon_env:
            warn(f"istio-compat B: {name} is `still open` but install-cni --list-env now prints it: re-measure its row")
    ours_only = sorted(n for n in daemon_env - set(istio_env) if f"`{n}`" not in texts["B"])
    for n in ours_only:
        warn(f"istio-compat B: install-cni reads {n}, in neither Istio's list nor B's 'Ours only' line")
    # C: the plugin's conflist entry, CNI_ARGS, run dir files.
    conf_rows = pinned_rows(os.path.join(tdir, "plugin-conf.txt"))
    c = rows["C"]
    missing = [r[0] for r in conf_rows if r[0] not in c]
    check(f"istio-compat C: every input of Istio's plugin ({len(conf_rows)}, plugin-conf.txt) has a row",
          not missing, f"missing: {missing}")
    cni_config = "".join(open(os.path.join(repo, "crates/cni-config/src", f)).read()
                         for f in sorted(os.listdir(os.path.join(repo, "crates/cni-config/src"))) if f.endswith(".rs"))
    settings_fields = set(re.findall(r"^\s*pub (\w+):", cni_config.split("pub struct PluginSettings", 1)[1]
                                     .split("\n}", 1)[0], re.M))
    plugin_src = open(os.path.join(repo, "crates/istio-cni/src/settings.rs")).read()
    bad = []
    for key, kind, _ in conf_rows:
        if c.get(key, ("", ""))[1] != "same":
            continue
        if kind == "field" and key not in settings_fields:
            bad.append(f"{key}: not a PluginSettings field")
        elif kind == "cni_args" and f'"{key}"' not in plugin_src:
            bad.append(f"{key}: not read in crates/istio-cni/src/settings.rs")
        elif kind == "run_dir" and f'"{key}"' not in cni_config:
            bad.append(f"{key}: no such file name in crates/cni-config")
    check("istio-compat C: each `same` conflist field is a PluginSettings field, each CNI_ARGS key the plugin "
          "reads, each file one crates/cni-config names", not bad, "; ".join(bad))

    def sources(*dirs):
        out = []
        for d in dirs:
            for root, _, files in os.walk(os.path.join(repo, d)):
                out += [open(os.path.join(root, f)).read() for f in sorted(files) if f.endswith(".rs")]
        return "\n".join(out)
    # D: annotation, label, container and env names read from pods.
    policy_src = sources("crates/pod-policy/src", "crates/ambient-agent/src", "crates/guardian/src",
                         "crates/install-cni/src")
    bad = [k for k, (_, s) in rows["D"].items()
           if s == "same" and ("/" in k or re.fullmatch(r"[A-Z][A-Z0-9_]+|istio-[a-z-]+", k))
           and f'"{k}"' not in policy_src]
    check("istio-compat D: each `same` annotation, label, container or env name is one our code reads",
          not bad, str(bad))
    # E: metric families.
    metric_rows = pinned_rows(os.path.join(tdir, "metrics.txt"))
    e = rows["E"]
    missing = [r[0] for r in metric_rows if r[0] not in e]
    check(f"istio-compat E: every metric family Istio's daemon exports ({len(metric_rows)}, metrics.txt) has a row",
          not missing, f"missing: {missing}")
    all_src = sources(*(os.path.join("crates", d, "src") for d in sorted(os.listdir(os.path.join(repo, "crates")))))
    bad = [k for k, (_, s) in e.items() if s == "same" and f'"{k}"' not in all_src]
    check("istio-compat E: each `same` family is rendered by our code (a string literal in crates/*/src)",
          not bad, str(bad))
    stray = [k for k in e if k not in {r[0] for r in metric_rows}]
    check("istio-compat E: every row names a pinned upstream family", not stray, str(stray))
    # Still open: listed, and only those.
    opened = [f"{sec}:{k}" for sec in "BCDEFG" for k, (_, s) in rows[sec].items() if s == "still open"]
    unlisted = [x for x in opened if f"`{x.split(':', 1)[1]}`" not in open_text]
    check(f"istio-compat: every `still open` row ({len(opened)}) is in the Still open list", not unlisted, str(unlisted))
    listed = re.findall(r"^- `([^`]+)`", open_text, re.M)
    stale = [k for k in listed if not any(x.split(":", 1)[1] == k for x in opened)]
    check("istio-compat: the Still open list names only `still open` rows", not stale, str(stale))


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

    values_file = yaml.safe_load(read("deploy/helm/istio-cni/values.yaml"))
    # Istio's layout: the defaults live under _internal_defaults_do_not_set (templates/zzz_profile.yaml).
    check("values.yaml holds only _internal_defaults_do_not_set (Istio's layout, for its profile merge)",
          list(values_file) == ["_internal_defaults_do_not_set"], str(list(values_file)))
    values = values_file["_internal_defaults_do_not_set"]
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

    for e in sorted(PENDING_DAEMON_ENV & daemon_env):
        warn(f"PENDING_DAEMON_ENV: install-cni --list-env now prints {e}: remove it from the allow-list")
    # --- renderings -------------------------------------------------------------------------
    rendered = {}
    kube_of = {}
    for name, over in VARIANTS.items():
        rc, out, err = helm_template(a.helm, chart, over if over else None)
        if check(f"helm template renders variant {name}", rc == 0, err.strip()):
            rendered[name] = (effective(values, chart, over), docs_of(out), out)
    istio_dir = os.path.join(repo, "deploy/testdata/istio/values")
    istio_files = sorted(f for f in os.listdir(istio_dir) if f.endswith(".yaml"))
    check("Istio values files present (default, ambient, openshift, gke, private registry, cni.-prefixed)",
          {"default.yaml", "ambient.yaml", "openshift.yaml", "gke.yaml", "private-registry.yaml",
           "cni-prefixed.yaml"} <= set(istio_files), str(istio_files))
    for f in istio_files:
        path = os.path.join(istio_dir, f)
        extra = ISTIO_FILE_ARGS.get(f, [])
        rc, out, err = helm_template_file(a.helm, chart, path, extra)
        name = f"istio:{f}"
        if check(f"our chart renders Istio's values file {f}", rc == 0, err.strip()):
            user = yaml.safe_load(open(path)) or {}
            rendered[name] = (effective(values, chart, user), docs_of(out), out)
            kube_of[name] = extra[1] if extra else ""
    for name, over in BAD_VALUES.items():
        rc, _, err = helm_template(a.helm, chart, over)
        check(f"chart refuses {name}", rc != 0 and "schema" in err.lower(), f"rc={rc} {err.strip()[:200]}")
    for name, (over, words) in BAD_COMBOS.items():
        rc, _, err = helm_template(a.helm, chart, over)
        check(f"chart refuses {name} naming the key and value", rc != 0 and all(w in err for w in words),
              f"rc={rc} {err.strip()[:300]}")

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
    # Istio's pinned chart rendered with this project's image: what the CRI e2e
    # (integration/tests/cri_istio_chart.rs) runs, checked in so the tests need no helm.
    istio_chart_dir = os.path.join(repo, "deploy/testdata/istio/istio-cni-chart")
    image_sets = ["--set", "global.hub=docker.io/istio-cni-rs", "--set", "global.tag=0.1.0", "--set", "global.variant="]
    for v in ("default", "ambient", "openshift"):
        rel = f"deploy/testdata/istio/rendered/{v}.yaml"
        values_file = os.path.join(repo, f"deploy/testdata/istio/values/{v}.yaml")
        rc, fresh, err = helm_template_file(a.helm, istio_chart_dir, values_file, image_sets)
        text = read(rel) if os.path.exists(os.path.join(repo, rel)) else ""
        check(f"{rel} is Istio's pinned chart rendered with values/{v}.yaml and our image (deploy/scripts/render.sh)",
              rc == 0 and re.sub(r"\A(#[^\n]*\n)+", "", text) == fresh,
              err.strip()[:300] or "out of date: run deploy/scripts/render.sh")

    # --- (1) Kubernetes schemas -------------------------------------------------------------
    sets = [("manifests/istio-cni.yaml", manifest_docs),
            ("manifests/istio-cni-ambient.yaml", docs_of(ambient_text))] + [(f"rendering {n}", r[1]) for n, r in rendered.items()]
    for kv in KUBE_VERSIONS:
        for label, docs in sets:
            errs = []
            for d in docs:
                if d.get("apiVersion", "").startswith("k8s.cni.cncf.io/"):
                    continue  # Multus' CRD (NetworkAttachmentDefinition): not in the Kubernetes schemas
                if kv == "1.25.0" and "appArmorProfile" in json.dumps(d):
                    continue  # useAppArmorAnnotation=false: appArmorProfile exists from Kubernetes 1.30 (Istio's note)
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
    paths = value_paths(values, schema["definitions"]["values"])
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

    vschema = schema["definitions"]["values"]

    def schema_keys(sc, prefix=""):
        out = set()
        for k, v in sc.get("properties", {}).items():
            out.add(prefix + k)
            if "$ref" not in v and k != "global" or prefix + k == "global":
                out |= schema_keys(v, prefix + k + ".")
        return out

    def value_keys(v, sc, prefix=""):
        out = set()
        for k, x in v.items():
            out.add(prefix + k)
            sub = sc.get("properties", {}).get(k, {})
            if isinstance(x, dict) and sub.get("properties") and k not in ("seccompProfile", "seLinuxOptions"):
                out |= value_keys(x, sub, prefix + k + ".")
        return out
    whole = ("seccompProfile.", "seLinuxOptions.", "updateStrategy.")
    skeys = {k for k in schema_keys(vschema) if not k.startswith(whole)}
    vkeys = {k for k in value_keys(values, vschema) if not k.startswith(whole)}
    check("values.schema.json describes exactly the keys of values.yaml (+ the accepted-only keys)",
          skeys - ACCEPTED_ONLY == vkeys,
          f"schema only: {sorted(skeys - ACCEPTED_ONLY - vkeys)}, values only: {sorted(vkeys - skeys)}")
    check("schema: the top level, `cni` and `_internal_defaults_do_not_set` share one definition",
          schema.get("allOf") == [{"$ref": "#/definitions/values"}]
          and vschema["properties"]["cni"]["$ref"] == "#/definitions/values"
          and vschema["properties"]["_internal_defaults_do_not_set"]["$ref"] == "#/definitions/values"
          and vschema.get("additionalProperties") is False)
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
    seeds = {"logLevel": "info", "excludeNamespaces": ["kube-system"], "cniBinDir": "/opt/cni/bin",
             "cniConfDir": "/etc/cni/net.d", "cniConfFileName": "", "chained": True, "redirectBackend": "auto"}
    check("seed defaults kept", all(values.get(k) == v for k, v in seeds.items()),
          str({k: values.get(k) for k in seeds}))
    check("Chart version == appVersion == tag == workspace version",
          chart_meta["version"] == str(chart_meta["appVersion"]) == str(values["global"]["tag"]) == ws_version
          and values["tag"] == "" and values["hub"] == "",
          f"{chart_meta['version']} {chart_meta['appVersion']} {values['global']['tag']} {ws_version}")

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
        pending = [e for e in unknown if PENDING_ENV.match(e) or e in PENDING_DAEMON_ENV]
        if pending:
            warn(f"[{name}] not read by this install-cni build yet (repair controller / ambient agent pending): {pending}")
        bad = [e for e in unknown if not PENDING_ENV.match(e) and e not in PENDING_DAEMON_ENV]
        check(f"[{name}] every env var set ({len(set_env)}) is one install-cni reads", not bad, f"unknown: {bad}")
        # env.* (Istio's passthrough) may replace a ConfigMap key: the container's env wins over envFrom.
        check(f"[{name}] no env var set twice (except env.* replacing a ConfigMap key)",
              len(env_names) == len(set(env_names)) and not (set(data) & set(env_names)) - set(vals["env"] or {}))
        user_env = {e["name"]: e.get("value") for e in ctr.get("env", []) if e["name"] in (vals["env"] or {})}
        check(f"[{name}] env passthrough: each env.* is a container env var with its value as a string",
              user_env == {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (vals["env"] or {}).items()},
              str(user_env))
        want_levels = expected_levels(vals)
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
              (data.get("LOG_LEVEL"), data.get("PLUGIN_LOG_LEVEL")) == want_levels
              and data.get("EXCLUDE_NAMESPACES") == ",".join(vals["excludeNamespaces"])
              and data.get("REDIRECT_BACKEND") == expected_backend(vals)
              and data.get("LOG_AS_JSON") == ("true" if vals["global"]["logAsJson"] else None)
              and data.get("ISTIO_OWNED_CNI_CONFIG") == str(vals["istioOwnedCNIConfig"]).lower()
              and data.get("ISTIO_OWNED_CNI_CONFIG_FILENAME") == (vals["istioOwnedCNIConfigFileName"] or "02-istio-cni.conflist")
              and (not vals["repair"]["enabled"] or (data.get("REPAIR_BROKEN_POD_LABEL_KEY"), data.get("REPAIR_BROKEN_POD_LABEL_VALUE"))
                   == (vals["repair"]["brokenPodLabelKey"], vals["repair"]["brokenPodLabelValue"]))
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
            mounted("CNI_BIN_TARGET_DIRS", t.strip(), expected_bin_dir(vals, kube_of.get(name, "")))
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
        if ambient and expected_backend(vals) != "nftables":
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
        want_pull = vals["pullPolicy"] or vals["global"]["imagePullPolicy"] or None
        check(f"[{name}] image {expected_image(vals)} (pull policy {want_pull})",
              ctr["image"] == expected_image(vals) and ctr.get("imagePullPolicy") == want_pull,
              f"{ctr['image']} {ctr.get('imagePullPolicy')}")

        # shape
        upd = ds["spec"].get("updateStrategy", {})
        check(f"[{name}] DaemonSet shape (name, priority class, sidecar.istio.io/inject, rolling update, grace)",
              ds["metadata"]["name"] + "-" == SELF_POD_PREFIX
              and ds["metadata"]["namespace"] == NAMESPACE
              and spec.get("priorityClassName") == "system-node-critical"
              and ann.get("sidecar.istio.io/inject") == "false"
              and upd == expected_strategy(vals)
              and spec.get("terminationGracePeriodSeconds") == vals["terminationGracePeriodSeconds"]
              and spec.get("serviceAccountName") == "istio-cni"
              and spec.get("hostNetwork") is True)
        check(f"[{name}] tolerations/nodeSelector/resources from values",
              spec.get("tolerations", []) == vals["tolerations"] and spec.get("nodeSelector", {}) == vals["nodeSelector"]
              and ctr.get("resources", {}) == (vals["resources"] or vals["global"]["defaultResources"])
              and spec.get("affinity", {}) == (vals["affinity"] or {}))
        labels = pod["metadata"].get("labels", {})
        check(f"[{name}] Istio's labels: pod (istio.io/dataplane-mode none, part-of istio, podLabels) and DaemonSet "
              f"(istio.io/rev, operator.istio.io/component, daemonSetLabels)",
              labels.get("istio.io/dataplane-mode") == "none" and labels.get("app.kubernetes.io/part-of") == "istio"
              and labels.get("k8s-app") == "istio-cni-node" and labels.get("sidecar.istio.io/inject") == "false"
              and all(labels.get(k) == v for k, v in (vals["podLabels"] or {}).items())
              and ds["metadata"]["labels"].get("istio.io/rev") == (vals["revision"] or "default")
              and ds["metadata"]["labels"].get("operator.istio.io/component") == "Cni"
              and ds["metadata"]["labels"].get("install.operator.istio.io/owning-resource") == (vals["ownerName"] or "unknown")
              and all(ds["metadata"]["labels"].get(k) == v for k, v in (vals["daemonSetLabels"] or {}).items()),
              f"pod {labels} ds {ds['metadata']['labels']}")
        apparmor_ann = ann.get("container.apparmor.security.beta.kubernetes.io/install-cni")
        sc0 = ctr.get("securityContext", {})
        check(f"[{name}] AppArmor unconfined by {'annotation' if vals['useAppArmorAnnotation'] else 'appArmorProfile'} "
              f"(useAppArmorAnnotation), podAnnotations, seccompProfile, seLinuxOptions",
              (apparmor_ann == "unconfined" and "appArmorProfile" not in sc0 if vals["useAppArmorAnnotation"]
               else apparmor_ann is None and sc0.get("appArmorProfile") == {"type": "Unconfined"})
              and all(ann.get(k) == v for k, v in (vals["podAnnotations"] or {}).items())
              and sc0.get("seccompProfile") == (vals["seccompProfile"] or None)
              and sc0.get("seLinuxOptions") == ({"type": "spc_t", **vals["seLinuxOptions"]} if vals["seLinuxOptions"] else None),
              f"{ann} {sc0}")
        if name == "default":
            check("[default] tolerates every taint", {"operator": "Exists"} in spec.get("tolerations", []))

        # security: capabilities follow the configuration
        sc = ctr.get("securityContext", {})
        caps = set(sc.get("capabilities", {}).get("add", []))
        want = set()
        backend = expected_backend(vals)
        if backend == "auto" or enter_pod_netns:
            want.add("NET_ADMIN")
        if enter_pod_netns:
            want |= {"SYS_ADMIN", "SYS_PTRACE"}
        # The image's iptables-legacy tools use raw sockets, where the node may be legacy.
        if backend != "nftables" and (backend == "auto" or enter_pod_netns):
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
        # the plugin's pod GET; on SIGTERM the daemon's own DaemonSet and node (rollout vs uninstall), both modes
        want = {("", "pods", "get"), ("apps", "daemonsets", "get", ds["metadata"]["name"]), ("", "nodes", "get")}
        if vals["repair"]["enabled"] or reconcile or ambient:
            want |= {("", "pods", "list"), ("", "pods", "watch")}
        if repair_mode == "delete":
            want |= {("", "pods", "delete"), ("", "events", "create"), ("", "events", "patch")}
        if repair_mode == "label":
            want |= {("", "pods/status", "patch"), ("", "events", "create"), ("", "events", "patch")}
        if reconcile:  # RedirectRulesRepaired events
            want |= {("", "events", "create"), ("", "events", "patch")}
        if vals["taint"]["enabled"]:
            want |= {("", "nodes", "patch")}
        if (vals["platform"] or vals["global"]["platform"]) == "openshift":  # as Istio: use the privileged SCC
            want |= {("security.openshift.io", "securitycontextconstraints", "use", "privileged")}
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
        sa = by_kind(docs, "ServiceAccount", "istio-cni")
        want_secrets = [{"name": x["name"] if isinstance(x, dict) else x} for x in (vals["global"]["imagePullSecrets"] or [])]
        check(f"[{name}] global.imagePullSecrets on the ServiceAccount ({len(want_secrets)})",
              sa and sa[0].get("imagePullSecrets", []) == want_secrets, str(sa and sa[0].get("imagePullSecrets")))
        rq = by_kind(docs, "ResourceQuota")
        check(f"[{name}] ResourceQuota exactly when resourceQuotas.enabled (pods {vals['resourceQuotas']['pods']}, "
              f"PriorityClass system-node-critical)",
              (not rq) if not vals["resourceQuotas"]["enabled"] else
              (len(rq) == 1 and rq[0]["metadata"]["name"] == "istio-cni-resource-quota"
               and rq[0]["spec"]["hard"] == {"pods": str(vals["resourceQuotas"]["pods"])}
               and rq[0]["spec"]["scopeSelector"]["matchExpressions"] == [
                   {"operator": "In", "scopeName": "PriorityClass", "values": ["system-node-critical"]}]), str(rq))
        nad = by_kind(docs, "NetworkAttachmentDefinition")
        check(f"[{name}] NetworkAttachmentDefinition istio-cni in default exactly when provider=multus ({vals['provider']})",
              (not nad) if vals["provider"] != "multus" else
              (len(nad) == 1 and nad[0]["metadata"]["name"] == "istio-cni" and nad[0]["metadata"]["namespace"] == "default"
               and nad[0]["apiVersion"] == "k8s.cni.cncf.io/v1"), str(nad))
        np_ = by_kind(docs, "NetworkPolicy")
        check(f"[{name}] NetworkPolicy exactly when global.networkPolicy.enabled (ingress {vals['monitoringPort']} + 8000, all egress)",
              (not np_) if not vals["global"]["networkPolicy"]["enabled"] else
              (len(np_) == 1 and np_[0]["metadata"]["name"] == "istio-cni" + (f"-{vals['revision']}" if vals["revision"] else "")
               and np_[0]["spec"]["podSelector"] == {"matchLabels": {"k8s-app": "istio-cni-node"}}
               and np_[0]["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": vals["monitoringPort"]}]},
                                                  {"ports": [{"protocol": "TCP", "port": 8000}]}]
               and np_[0]["spec"]["egress"] == [{}]), str(np_))

    # --- (6) Istio's values files: literal expectations, NOTES.txt, Istio's own chart ---------
    def ds_of(docs):
        d = by_kind(docs, "DaemonSet")
        return d[0] if d else {"metadata": {}, "spec": {"template": {"metadata": {}, "spec": {"containers": [{}]}}}}

    def ctr_of(d):
        return next((c for c in d["spec"]["template"]["spec"]["containers"] if c.get("name") == "install-cni"), {})

    def cm_data(docs):
        c = by_kind(docs, "ConfigMap", "istio-cni-config")
        return (c[0].get("data") or {}) if c else {}

    def host_mounts(d):
        """{container mountPath: host path} of the hostPath volumes mounted."""
        vols = {v["name"]: v.get("hostPath", {}).get("path") for v in d["spec"]["template"]["spec"].get("volumes", [])}
        return {m["mountPath"]: vols.get(m["name"]) for m in ctr_of(d).get("volumeMounts", [])}

    # Literal expectations per file: what a user of Istio's chart wrote, and what must come out.
    LITERAL = {
        "default.yaml": lambda docs: {
            "image": ctr_of(ds_of(docs)).get("image") == "registry.example.com/istio-cni-rs/install-cni:0.1.0",
            "LOG_LEVEL=PLUGIN_LOG_LEVEL=info (global.logging.level)": (cm_data(docs).get("LOG_LEVEL"), cm_data(docs).get("PLUGIN_LOG_LEVEL")) == ("info", "info"),
            "EXCLUDE_NAMESPACES=kube-system": cm_data(docs).get("EXCLUDE_NAMESPACES") == "kube-system",
            "Istio's tolerations": ds_of(docs)["spec"]["template"]["spec"].get("tolerations") == [
                {"effect": "NoSchedule", "operator": "Exists"}, {"key": "CriticalAddonsOnly", "operator": "Exists"},
                {"effect": "NoExecute", "operator": "Exists"}],
            "resources 100m/100Mi": ctr_of(ds_of(docs)).get("resources") == {"requests": {"cpu": "100m", "memory": "100Mi"}},
            "no ambient": cm_data(docs).get("AMBIENT_ENABLED") == "false",
        },
        "ambient.yaml": lambda docs: {
            "profile=ambient: AMBIENT_ENABLED": cm_data(docs).get("AMBIENT_ENABLED") == "true",
            "profile=ambient's global.variant distroless: tag not suffixed": ctr_of(ds_of(docs)).get("image") == "registry.example.com/istio-cni-rs/install-cni:0.1.0",
            "scoped level: LOG_LEVEL info, PLUGIN_LOG_LEVEL debug": (cm_data(docs).get("LOG_LEVEL"), cm_data(docs).get("PLUGIN_LOG_LEVEL")) == ("info", "debug"),
            "AMBIENT_IPV6=false": cm_data(docs).get("AMBIENT_IPV6") == "false",
            "netns and ztunnel mounts": host_mounts(ds_of(docs)).get("/var/run/netns") == "/var/run/netns"
                                        and host_mounts(ds_of(docs)).get("/var/run/ztunnel") == "/var/run/ztunnel",
        },
        "openshift.yaml": lambda docs: {
            "bin dir /var/lib/cni/bin": host_mounts(ds_of(docs)).get("/host/opt/cni/bin") == "/var/lib/cni/bin",
            "conf dir /etc/cni/multus/net.d": host_mounts(ds_of(docs)).get("/host/etc/cni/net.d") == "/etc/cni/multus/net.d",
            "CHAINED_CNI_PLUGIN=false, CNI_CONF_NAME=istio-cni.conf": (cm_data(docs).get("CHAINED_CNI_PLUGIN"), cm_data(docs).get("CNI_CONF_NAME")) == ("false", "istio-cni.conf"),
            "seLinuxOptions type spc_t": ctr_of(ds_of(docs)).get("securityContext", {}).get("seLinuxOptions") == {"type": "spc_t"},
            "NetworkAttachmentDefinition istio-cni": len(by_kind(docs, "NetworkAttachmentDefinition", "istio-cni")) == 1,
            "ClusterRole: use SCC privileged": any(r.get("apiGroups") == ["security.openshift.io"] and r.get("resourceNames") == ["privileged"]
                                                   and r.get("verbs") == ["use"] for r in (by_kind(docs, "ClusterRole", "istio-cni") or [{}])[0].get("rules", [])),
            "ambient on": cm_data(docs).get("AMBIENT_ENABLED") == "true",
        },
        "gke.yaml": lambda docs: {
            "cniBinDir \"\" on a -gke version: /home/kubernetes/bin": host_mounts(ds_of(docs)).get("/host/opt/cni/bin") == "/home/kubernetes/bin",
            "ResourceQuota pods 5000": [q["spec"]["hard"] for q in by_kind(docs, "ResourceQuota")] == [{"pods": "5000"}],
            "compatibilityVersion 1.25: AMBIENT_RECONCILE_POD_RULES_ON_STARTUP=false": cm_data(docs).get("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP") == "false",
        },
        "private-registry.yaml": lambda docs: {
            "image from global.hub/global.tag": ctr_of(ds_of(docs)).get("image") == "registry.corp.example/mesh/install-cni:0.1.0",
            "imagePullPolicy Always": ctr_of(ds_of(docs)).get("imagePullPolicy") == "Always",
            "pull secrets on the ServiceAccount": by_kind(docs, "ServiceAccount")[0].get("imagePullSecrets") == [{"name": "corp-registry"}, {"name": "corp-registry-backup"}],
            "LOG_AS_JSON, LOG_LEVEL warn": (cm_data(docs).get("LOG_AS_JSON"), cm_data(docs).get("LOG_LEVEL")) == ("true", "warn"),
            "NetworkPolicy istio-cni-1-27": [n["metadata"]["name"] for n in by_kind(docs, "NetworkPolicy")] == ["istio-cni-1-27"],
            "istio.io/rev 1-27 on every Istio-labelled object": all(d["metadata"]["labels"].get("istio.io/rev") == "1-27" for d in docs
                                                                   if d["kind"] in ("DaemonSet", "ConfigMap", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "NetworkPolicy")),
            "pod label/annotation, DaemonSet label": ds_of(docs)["spec"]["template"]["metadata"]["labels"].get("corp.example/team") == "platform"
                                                      and ds_of(docs)["spec"]["template"]["metadata"]["annotations"].get("cost-center.corp.example/owner") == "platform"
                                                      and ds_of(docs)["metadata"]["labels"].get("corp.example/tier") == "infra",
            "affinity": "nodeAffinity" in ds_of(docs)["spec"]["template"]["spec"].get("affinity", {}),
            "appArmorProfile Unconfined, no annotation": ctr_of(ds_of(docs)).get("securityContext", {}).get("appArmorProfile") == {"type": "Unconfined"}
                                                         and "container.apparmor.security.beta.kubernetes.io/install-cni" not in ds_of(docs)["spec"]["template"]["metadata"]["annotations"],
            "maxUnavailable 10%, grace 60": ds_of(docs)["spec"].get("updateStrategy") == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}
                                            and ds_of(docs)["spec"]["template"]["spec"].get("terminationGracePeriodSeconds") == 60,
            "ResourceQuota pods 2000": [q["spec"]["hard"] for q in by_kind(docs, "ResourceQuota")] == [{"pods": "2000"}],
            "labelPods with the broken-pod label": (cm_data(docs).get("REPAIR_LABEL_PODS"), cm_data(docs).get("REPAIR_BROKEN_POD_LABEL_KEY"),
                                                    cm_data(docs).get("REPAIR_BROKEN_POD_LABEL_VALUE")) == ("true", "corp.example/cni-uninitialized", "yes"),
            "env CNI_CONF_GROUP_READ on the container": {"name": "CNI_CONF_GROUP_READ", "value": "true"} in ctr_of(ds_of(docs)).get("env", []),
            "ISTIO_OWNED_CNI_CONFIG(_FILENAME)": (cm_data(docs).get("ISTIO_OWNED_CNI_CONFIG"), cm_data(docs).get("ISTIO_OWNED_CNI_CONFIG_FILENAME")) == ("true", "02-istio-cni.conflist"),
        },
        "cni-prefixed.yaml": lambda docs: {
            "cni.cniBinDir": host_mounts(ds_of(docs)).get("/host/opt/cni/bin") == "/var/lib/cni/bin",
            "cni.excludeNamespaces": cm_data(docs).get("EXCLUDE_NAMESPACES") == "kube-system,istio-system,monitoring",
            "cni.logging.level debug": (cm_data(docs).get("LOG_LEVEL"), cm_data(docs).get("PLUGIN_LOG_LEVEL")) == ("debug", "debug"),
            "cni.ambient: AMBIENT_ENABLED, AMBIENT_DNS_CAPTURE=false": (cm_data(docs).get("AMBIENT_ENABLED"), cm_data(docs).get("AMBIENT_DNS_CAPTURE")) == ("true", "false"),
            "cni.repair deletePods": (cm_data(docs).get("REPAIR_REPAIR_PODS"), cm_data(docs).get("REPAIR_DELETE_PODS")) == ("false", "true"),
            "cni.rollingMaxUnavailable 25%": ds_of(docs)["spec"].get("updateStrategy", {}).get("rollingUpdate") == {"maxUnavailable": "25%"},
            "cni.podAnnotations": ds_of(docs)["spec"]["template"]["metadata"]["annotations"].get("example.com/scrape-group") == "cni",
            "cni.resources": ctr_of(ds_of(docs)).get("resources") == {"requests": {"cpu": "50m", "memory": "64Mi"}},
            "global.nativeNftables: REDIRECT_BACKEND=nft": cm_data(docs).get("REDIRECT_BACKEND") == "nft",
            "global.imagePullPolicy": ctr_of(ds_of(docs)).get("imagePullPolicy") == "IfNotPresent",
        },
    }
    # NOTES.txt must name every ignored key the file carries.
    NOTES_WANT = {
        "ambient.yaml": ["variant/global.variant=distroless", "ambient.shareHostNetworkNamespace=false"],
        "openshift.yaml": ["variant/global.variant=distroless", "platform: openshift"],
        "private-registry.yaml": ["global.meshID", "global.network", "global.multiCluster", "global.proxy"],
        "cni-prefixed.yaml": ["pilot:", "meshConfig:", "cni.enabled"],
        "default.yaml": [],
        "gke.yaml": ["compatibilityVersion: 1.25", "platform: gke"],
    }
    istio_chart = os.path.join(repo, "deploy/testdata/istio/istio-cni-chart")
    for f in istio_files:
        name = f"istio:{f}"
        if name not in rendered:
            continue
        docs = rendered[name][1]
        for label, ok in LITERAL.get(f, lambda d: {"(no literal expectations for this file)": False})(docs).items():
            check(f"[{name}] {label}", ok)
        path = os.path.join(istio_dir, f)
        rc, notes, err = helm_notes(a.helm, chart, path)
        missing = [w for w in NOTES_WANT.get(f, []) if w not in notes]
        check(f"[{name}] NOTES.txt names the ignored/overridden keys {NOTES_WANT.get(f, [])}", rc == 0 and not missing,
              f"missing {missing}: {notes[:600]} {err[:200]}")
        check(f"[{name}] NOTES.txt warns only about keys the file carries (no WARNING for Istio's documented defaults)",
              f != "default.yaml" or "WARNING" not in notes, notes[:400])
        # Istio's own chart with the same file: the parts that must match.
        rc, iout, err = helm_template_file(a.helm, istio_chart, path, ISTIO_FILE_ARGS.get(f, []))
        if not check(f"[{name}] Istio's pinned chart renders the same file", rc == 0, err.strip()[:300]):
            continue
        idocs = docs_of(iout)
        ids, ods = ds_of(idocs), ds_of(docs)
        vals = rendered[name][0]
        check(f"[{name}] vs Istio: DaemonSet name, namespace and selector",
              (ods["metadata"].get("name"), ods["metadata"].get("namespace"), ods["spec"].get("selector"))
              == (ids["metadata"].get("name"), ids["metadata"].get("namespace"), ids["spec"].get("selector")),
              f"{ods['spec'].get('selector')} vs {ids['spec'].get('selector')}")
        ienv = dict(cm_data(idocs))
        ienv.update({e["name"]: e["value"] for e in ctr_of(ids).get("env", []) if "value" in e})
        oenv = dict(cm_data(docs))
        oenv.update({e["name"]: e["value"] for e in ctr_of(ods).get("env", []) if "value" in e})
        # Differs on purpose (docs/istio-compat.md): our own conflist is on by default (Istio: opt-in).
        skip = set() if "istioOwnedCNIConfig" in json.dumps(yaml.safe_load(open(path))) else {"ISTIO_OWNED_CNI_CONFIG"}
        common = sorted((set(ienv) & set(oenv)) - skip)
        diff = {k: (oenv[k], ienv[k]) for k in common if str(oenv[k]) != str(ienv[k])}
        check(f"[{name}] vs Istio: env vars both render have the same values ({len(common)}: {', '.join(common)})",
              len(common) >= 8 and not diff, f"ours vs Istio: {diff}")
        ilvl = [x.split("=", 1)[1] for x in ctr_of(ids).get("args", []) if x.startswith("--log_output_level=")]
        ispec = (ilvl or [""])[0]
        check(f"[{name}] vs Istio: Istio's --log_output_level={ispec} reaches our LOG_LEVEL/PLUGIN_LOG_LEVEL",
              (oenv.get("LOG_LEVEL"), oenv.get("PLUGIN_LOG_LEVEL")) == expected_levels(vals)
              # a file that sets no level: Istio's global.logging.level default `info` vs our logLevel
              # default `warn` (differs on purpose, docs/istio-compat.md)
              and (ispec == (vals["logging"]["level"] or vals["global"]["logging"]["level"])
                   or (ispec == "info" and not (vals["logging"]["level"] or vals["global"]["logging"]["level"])
                       and oenv.get("LOG_LEVEL") == vals["logLevel"])), ispec)
        # host paths: Istio mounts the pod netns dir at /host/var/run/netns, ours at its host path; ours
        # adds the node's xtables lock (ambient, legacy-capable backend).
        ih = {v for k, v in host_mounts(ids).items()}
        oh = {v for k, v in host_mounts(ods).items()} - {"/run/xtables.lock"}
        if vals["reconcile"]["enabled"]:
            oh -= {"/proc"} - ih  # our continuous reconcile (no Istio value) enters pod netns through /proc
        check(f"[{name}] vs Istio: the same host directories mounted ({sorted(oh)})", oh == ih,
              f"ours only {sorted(oh - ih)}, Istio only {sorted(ih - oh)}")
        same_ctr = {k: (ctr_of(ods).get(k), ctr_of(ids).get(k)) for k in ("imagePullPolicy",)}
        ispec_pod, ospec_pod = ids["spec"]["template"]["spec"], ods["spec"]["template"]["spec"]
        for k in ("affinity", "terminationGracePeriodSeconds", "priorityClassName", "serviceAccountName"):
            same_ctr[k] = (ospec_pod.get(k), ispec_pod.get(k))
        for k in ("seLinuxOptions", "appArmorProfile"):
            same_ctr[k] = (ctr_of(ods).get("securityContext", {}).get(k), ctr_of(ids).get("securityContext", {}).get(k))
        same_ctr["updateStrategy"] = (ods["spec"].get("updateStrategy"), ids["spec"].get("updateStrategy"))
        if "tolerations" in json.dumps(yaml.safe_load(open(path))):
            same_ctr["tolerations"] = (ospec_pod.get("tolerations"), ispec_pod.get("tolerations"))
        if "rollingMaxUnavailable" in json.dumps(yaml.safe_load(open(path))):
            # Istio's chart has no rollingMaxUnavailable (IstioOperator only): ours honours it.
            same_ctr.pop("updateStrategy")
        bad = {k: v for k, v in same_ctr.items() if v[0] != v[1]}
        check(f"[{name}] vs Istio: pod spec fields {sorted(same_ctr)}", not bad, f"ours vs Istio: {bad}")
        ilab = {k: v for k, v in ids["metadata"].get("labels", {}).items() if k not in ("helm.sh/chart", "app.kubernetes.io/version")}
        iplab = {k: v for k, v in ids["spec"]["template"]["metadata"].get("labels", {}).items() if k not in ("helm.sh/chart", "app.kubernetes.io/version")}
        ipann = {k: v for k, v in ids["spec"]["template"]["metadata"].get("annotations", {}).items()}
        olab, oplab, opann = ods["metadata"].get("labels", {}), ods["spec"]["template"]["metadata"].get("labels", {}), ods["spec"]["template"]["metadata"].get("annotations", {})
        check(f"[{name}] vs Istio: Istio's DaemonSet labels, pod labels and pod annotations are ours too",
              all(olab.get(k) == str(v) for k, v in ilab.items()) and all(oplab.get(k) == str(v) for k, v in iplab.items())
              and all(opann.get(k) == str(v) for k, v in ipann.items()),
              f"labels {[k for k, v in ilab.items() if olab.get(k) != str(v)]} pod {[k for k, v in iplab.items() if oplab.get(k) != str(v)]} "
              f"ann {[k for k, v in ipann.items() if opann.get(k) != str(v)]}")
        kinds = lambda ds_: sorted((d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")) for d in ds_  # noqa: E731
                                   if d["kind"] in ("ServiceAccount", "ConfigMap", "DaemonSet", "ResourceQuota", "NetworkAttachmentDefinition", "NetworkPolicy"))
        check(f"[{name}] vs Istio: the same namespaced objects (names, namespaces)", kinds(docs) == kinds(idocs),
              f"ours {kinds(docs)} Istio {kinds(idocs)}")
        isa, osa = by_kind(idocs, "ServiceAccount"), by_kind(docs, "ServiceAccount")
        check(f"[{name}] vs Istio: ServiceAccount imagePullSecrets",
              (osa[0].get("imagePullSecrets") if osa else None) == (isa[0].get("imagePullSecrets") if isa else None))
        for kind in ("ResourceQuota", "NetworkPolicy"):
            i_, o_ = by_kind(idocs, kind), by_kind(docs, kind)
            if i_ or o_:
                check(f"[{name}] vs Istio: {kind} spec", [x["spec"] for x in o_] == [x["spec"] for x in i_],
                      f"ours {[x['spec'] for x in o_]} Istio {[x['spec'] for x in i_]}")
        irules = [r for c in by_kind(idocs, "ClusterRole") for r in c["rules"] if r["apiGroups"] == ["security.openshift.io"]]
        orules = [r for c in by_kind(docs, "ClusterRole") for r in c["rules"] if r["apiGroups"] == ["security.openshift.io"]]
        check(f"[{name}] vs Istio: OpenShift SCC rule", orules == irules, f"ours {orules} Istio {irules}")

    # global.resourceScope: the cluster / namespace split, against Istio's chart.
    for scope in ("cluster", "namespace"):
        over = {"global": {"resourceScope": scope, "networkPolicy": {"enabled": True}}, "provider": "multus",
                "resourceQuotas": {"enabled": True}}
        rc, out, err = helm_template(a.helm, chart, over)
        rc2, iout, err2 = helm_template(a.helm, istio_chart, over)
        if check(f"global.resourceScope={scope} renders (ours and Istio's)", rc == 0 and rc2 == 0, err + err2):
            ok_kinds = {d["kind"] for d in docs_of(out)}
            i_kinds = {d["kind"] for d in docs_of(iout)}
            want = {"ClusterRole", "ClusterRoleBinding"} if scope == "cluster" else \
                {"ServiceAccount", "ConfigMap", "DaemonSet", "ResourceQuota", "NetworkAttachmentDefinition", "NetworkPolicy"}
            check(f"global.resourceScope={scope}: exactly the {scope} objects {sorted(want)} (Istio: {sorted(i_kinds)}; "
                  f"Istio also renders its NetworkPolicy for cluster, ours keeps it namespaced)",
                  ok_kinds == want and (i_kinds - {"NetworkPolicy"}) == (want - {"NetworkPolicy"}), str(sorted(ok_kinds)))

    # docs/istio-compat.md: one row per leaf key of the pinned Istio chart's values.yaml.
    ivals = yaml.safe_load(open(os.path.join(istio_chart, "values.yaml")))["_internal_defaults_do_not_set"]

    def leaves(v, prefix=""):
        out = []
        for k, x in v.items():
            if isinstance(x, dict) and x:
                out += leaves(x, f"{prefix}{k}.")
            else:
                out.append(f"{prefix}{k}")
        return out
    compat = read("docs/istio-compat.md")
    crow = {}
    for line in compat.splitlines():
        m = re.match(r"^\|\s*`([\w.]+)`\s*\|[^|]*\|\s*(same|differs on purpose: [^|]+|not applicable: [^|]+)\s*\|", line)
        if m:
            crow[m.group(1)] = m.group(2)
    ileaves = leaves(ivals)
    missing = [k for k in ileaves if k not in crow]
    check(f"docs/istio-compat.md has a row with a status for every leaf key of Istio's values.yaml ({len(ileaves)})",
          not missing, f"missing: {missing}")
    check("docs/istio-compat.md: every upstream key row is accepted by our schema (no status 'missing')",
          "| missing |" not in compat)
    for k in ileaves:
        rc, _, err = helm_template(a.helm, chart, functools.reduce(lambda acc, part: {part: acc}, reversed(k.split(".")),
                                                                    get_path(ivals, k)))
        check(f"our chart accepts Istio's default for {k}", rc == 0, err.strip()[:200])
    # docs/istio-compat.md sections B-G (daemon, plugin, pods, metrics, profiles, objects).
    istio_compat_beyond_chart(repo, compat, daemon_env, open(a.help_text).read(), daemon_defaults)

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
