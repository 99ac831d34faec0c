"""Checks docker/ without Docker or a cluster (run by tests/ops/container.sh):
every YAML file parses (PyYAML); every subcommand and flag the files give the
binary exists in its --help; ports, paths and environment variables agree
with the configs, which pass `check-config`; the Kubernetes grace period
outlasts the drain. Each failed check is printed; the exit code is their count.

Usage: container.py BINARY"""

import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCKER = os.path.join(ROOT, "docker")
BIN = sys.argv[1]
failures = []
passed = 0


def check(ok, what):
    global passed
    if ok:
        passed += 1
    else:
        failures.append(what)
        print(f"container.py: FAIL: {what}", file=sys.stderr)
    return ok


def run(*args, env=None):
    return subprocess.run([BIN, *args], capture_output=True, text=True, env=env if env is not None else {})


HELP = {}


def help_of(sub):
    if sub not in HELP:
        HELP[sub] = run(*([sub] if sub else []), "--help").stdout
    return HELP[sub]


def subcommands():
    text = help_of(None)
    block = text.split("Commands:", 1)[1].split("Options:", 1)[0]
    return {line.split()[0] for line in block.splitlines() if line.strip()}


def check_argv(argv, where):
    """`argv` (without the program) names an existing subcommand and flags."""
    sub = argv[0] if argv and not argv[0].startswith("-") else None
    if sub is not None and not check(sub in subcommands(), f"{where}: no subcommand `{sub}` in sessionless --help"):
        return
    for arg in argv:
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            check(re.search(rf"(^|\s){re.escape(flag)}\b", help_of(sub), re.M) is not None,
                  f"{where}: no flag {flag} in `sessionless {sub or ''} --help`")


def check_config(path, where):
    """check-config with an empty environment; returns its report."""
    out = run("check-config", path)
    check(out.returncode == 0, f"{where}: check-config {path} failed: {out.stderr.strip()}")
    return out.stdout


def report_value(report, key):
    m = re.search(rf"^{key} (\S+)$", report, re.M)
    return m.group(1) if m else None


def needed_env(report):
    """Environment variables the config needs (listed by check-config), and
    whether each is optional (a default applies)."""
    found = {}
    for line in report.splitlines():
        m = re.match(r"\s+\$(\w+)\s+.*: (present|absent \(a default applies\)|ABSENT.*)$", line)
        if m:
            found[m.group(1)] = m.group(2).startswith("absent (a default")
    return found


def port(addr):
    return int(addr.rsplit(":", 1)[1])


# --- every YAML file parses -------------------------------------------------------
docs = {}
for path in sorted(glob.glob(os.path.join(DOCKER, "**", "*.y*ml"), recursive=True)):
    try:
        with open(path) as f:
            docs[os.path.relpath(path, DOCKER)] = [d for d in yaml.safe_load_all(f) if d is not None]
        check(True, path)
    except yaml.YAMLError as e:
        check(False, f"{path} does not parse: {e}")
check({"compose.yaml", "kubernetes.yaml"} <= docs.keys(), "docker/compose.yaml and docker/kubernetes.yaml exist")

# --- every shipped config passes check-config offline --------------------------------
for path in sorted(glob.glob(os.path.join(ROOT, "config", "*.toml"))):
    check_config(path, "config/")

# --- Dockerfile --------------------------------------------------------------------
dockerfile = open(os.path.join(DOCKER, "Dockerfile")).read()
logical = re.sub(r"\\\n", " ", dockerfile)
instructions = [l.strip() for l in logical.splitlines() if l.strip() and not l.strip().startswith("#")]
entrypoint = cmd = healthcheck = user = None
exposed = []
for ins in instructions:
    word, _, rest = ins.partition(" ")
    if word == "ENTRYPOINT":
        entrypoint = json.loads(rest)
    elif word == "CMD":
        cmd = json.loads(rest)
    elif word == "HEALTHCHECK":
        healthcheck = json.loads(rest.split(" CMD ", 1)[1])
    elif word == "EXPOSE":
        exposed = [int(p) for p in rest.split()]
    elif word == "USER":
        user = rest.strip()
    elif word == "COPY" and "--from" not in rest:
        for src in rest.split()[:-1]:
            check(os.path.exists(os.path.join(ROOT, src)), f"Dockerfile COPY {src}: no such file")
# tini as PID 1 (it reaps what a stdio upstream leaves re-parented), then the binary.
check(entrypoint == ["/usr/bin/tini", "--", "sessionless"], "Dockerfile ENTRYPOINT is tini, then the binary")
check(any(i.startswith("RUN ") and "tini" in i for i in instructions), "Dockerfile installs tini")
check_argv(cmd, "Dockerfile CMD")
check(healthcheck is not None and healthcheck[0] == "sessionless", "Dockerfile HEALTHCHECK runs the binary")
if healthcheck:
    check_argv(healthcheck[1:], "Dockerfile HEALTHCHECK")
    listen = cmd[cmd.index("--listen") + 1]
    check(f":{port(listen)}/" in healthcheck[-1], "Dockerfile HEALTHCHECK checks the port CMD listens on")
cluster_report = check_config(os.path.join(ROOT, "config", "cluster.toml"), "cluster.toml")
check(port(listen) in exposed and port(report_value(cluster_report, "cluster internal listener")) in exposed,
      f"Dockerfile EXPOSE {exposed}: the listen port and cluster.toml's internal port")
check(user not in (None, "root", "0"), "Dockerfile runs as a non-root USER")

# --- compose ---------------------------------------------------------------------------
compose = docs["compose.yaml"][0]
services = compose["services"]
check({"gateway", "upstream", "prometheus", "grafana"} <= services.keys(), "compose: gateway, upstream, prometheus, grafana")
for name in ("gateway", "upstream"):
    check_argv(services[name]["command"], f"compose {name}.command")
    test = services[name].get("healthcheck", {}).get("test")
    if test:
        check(test[:2] == ["CMD", "sessionless"], f"compose {name}.healthcheck runs the binary")
        check_argv(test[2:], f"compose {name}.healthcheck")
gw = services["gateway"]
conf_in_container = gw["command"][gw["command"].index("--config") + 1]
mounts = {v.split(":")[1]: v.split(":")[0] for v in gw.get("volumes", [])}
check(conf_in_container in mounts, f"compose gateway: {conf_in_container} is mounted")
compose_conf = os.path.join(DOCKER, mounts.get(conf_in_container, "missing"))
report = check_config(compose_conf, "compose gateway config")
for var, optional in needed_env(report).items():
    check(optional or var in gw.get("environment", {}), f"compose gateway: ${var} the config needs is not set")
listen = report_value(report, "listen")
check(f"{port(listen)}:{port(listen)}" in gw.get("ports", []), "compose gateway publishes its listen port")
check(f":{port(listen)}/" in gw["healthcheck"]["test"][-1], "compose gateway healthcheck uses its listen port")
up_cmd = services["upstream"]["command"]
up_port = port(up_cmd[up_cmd.index("--listen") + 1])
check(re.search(rf'url = "http://upstream:{up_port}/mcp"', open(compose_conf).read()) is not None,
      "compose gateway config reaches the upstream service on its port")
grace = services["gateway"].get("stop_grace_period", "10s")
# After the drain: 5 s for open requests and declining paused calls, at most
# 5 s to close upstream sessions (README, Run).
check(int(grace.rstrip("s")) * 1000 > int(report_value(report, "drain_timeout_ms")) + 10_000,
      "compose gateway stop_grace_period outlasts the drain and the 10 s after it")
prom = services["prometheus"]
prom_file = [v.split(":")[0] for v in prom["volumes"] if "prometheus.yml" in v][0]
prom_conf = yaml.safe_load(open(os.path.join(DOCKER, prom_file)))
targets = [t for sc in prom_conf["scrape_configs"] for s in sc["static_configs"] for t in s["targets"]]
check(f"gateway:{port(listen)}" in targets, "compose prometheus scrapes the gateway's listen port")
graf = services["grafana"]
gmounts = {v.split(":")[1]: v.split(":")[0] for v in graf["volumes"]}
check(os.path.isdir(os.path.join(DOCKER, gmounts.get("/etc/grafana/provisioning", "-"))), "compose grafana provisioning dir")
providers = docs["grafana/provisioning/dashboards/sessionless.yaml"][0]["providers"]
dash_dir = providers[0]["options"]["path"]
check(os.path.isfile(os.path.join(DOCKER, gmounts.get(dash_dir, "-"), "sessionless.json")),
      "compose grafana: dashboards/sessionless.json mounted where the provider reads")
sources = docs["grafana/provisioning/datasources/prometheus.yaml"][0]["datasources"]
check(any(s["type"] == "prometheus" and "prometheus:9090" in s["url"] for s in sources),
      "compose grafana: a Prometheus data source on the prometheus service")

# --- Kubernetes -----------------------------------------------------------------------
kube = {(d["kind"], d["metadata"]["name"]): d for d in docs["kubernetes.yaml"]}
kinds = {k for k, _ in kube}
check({"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"} <= kinds, f"kubernetes: kinds {sorted(kinds)}")
deploy = next(d for (k, _), d in kube.items() if k == "Deployment")
pod = deploy["spec"]["template"]["spec"]
labels = deploy["spec"]["template"]["metadata"]["labels"]
check(deploy["spec"]["replicas"] >= 2, "kubernetes: several replicas")
check(deploy["spec"]["selector"]["matchLabels"].items() <= labels.items(), "kubernetes: the selector matches the pods")
c = pod["containers"][0]
check_argv(c["args"], "kubernetes container args")
# The image is built locally (README, Install): a `:latest` tag without a pull
# policy is pulled from a registry every time, never taken from the node.
check(c.get("imagePullPolicy") in ("IfNotPresent", "Never"),
      f"kubernetes: imagePullPolicy IfNotPresent or Never for the locally built {c['image']}")
conf_path = c["args"][c["args"].index("--config") + 1]
mount = next((m for m in c["volumeMounts"] if conf_path.startswith(m["mountPath"] + "/")), None)
check(mount is not None, f"kubernetes: {conf_path} is on a mounted volume")
volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
cm = kube[("ConfigMap", volume["configMap"]["name"])]
key = os.path.relpath(conf_path, mount["mountPath"])
check(key in cm["data"], f"kubernetes: the ConfigMap has {key}")
with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
    f.write(cm["data"][key])
    f.flush()
    report = check_config(f.name, "kubernetes ConfigMap")
env = {e["name"]: e for e in c.get("env", [])}
for var, optional in needed_env(report).items():
    # Optional ones: HOSTNAME (the pod name) is set by Kubernetes itself.
    check(var in env or (optional and var == "HOSTNAME") or (optional and var == "SESSIONLESS_INSTANCE_ID"),
          f"kubernetes: ${var} the config needs is not set in the container")
for var in ("SESSIONLESS_ADVERTISE_ADDR",):
    if var in needed_env(report):
        value = env.get(var, {}).get("value", "")
        internal = port(report_value(report, "cluster internal listener"))
        check(value.endswith(f":{internal}") and "$(POD_IP)" in value,
              f"kubernetes: ${var} is the pod IP and the internal port {internal}")
        check("POD_IP" in env and list(env).index("POD_IP") < list(env).index(var), "kubernetes: POD_IP is defined before use")
for name, e in env.items():
    ref = e.get("valueFrom", {}).get("secretKeyRef")
    if ref:
        check(ref["key"] == name and f"--from-literal={name}=" in open(os.path.join(DOCKER, "kubernetes.yaml")).read(),
              f"kubernetes: secret key {ref['key']} is created by the documented kubectl command")
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
check(ports.get("http") == port(report_value(report, "listen")), "kubernetes: containerPort http is the listen port")
check(ports.get("internal") == port(report_value(report, "cluster internal listener")),
      "kubernetes: containerPort internal is the cluster internal port")
check(c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["readinessProbe"]["httpGet"]["port"] in ("http", ports.get("http")),
      "kubernetes: readiness on /readyz")
check(c["livenessProbe"]["httpGet"]["path"] == "/healthz", "kubernetes: liveness on /healthz")
pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
pre_stop_s = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0
drain_ms = int(report_value(report, "drain_timeout_ms"))
# After the drain: 5 s for open requests and declining paused calls (side by
# side), at most 5 s to close upstream sessions.
check(pod["terminationGracePeriodSeconds"] * 1000 > pre_stop_s * 1000 + drain_ms + 10_000,
      f"kubernetes: terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']} must outlast "
      f"preStop {pre_stop_s} s + drain {drain_ms} ms + 10 s")
user_id = pod.get("securityContext", {}).get("runAsUser")
check(pod.get("securityContext", {}).get("runAsNonRoot") is True and str(user_id) == user,
      f"kubernetes: runs as the image's non-root user {user}")
services_k = [d for (k, _), d in kube.items() if k == "Service"]
headless = [s for s in services_k if s["spec"].get("clusterIP") == "None"]
check(len(headless) == 1 and len(services_k) == 2, "kubernetes: a Service and a headless Service")
for s in services_k:
    check(s["spec"]["selector"].items() <= labels.items(), f"kubernetes: Service {s['metadata']['name']} selects the pods")
    for p in s["spec"]["ports"]:
        check(p["targetPort"] in ports or p["targetPort"] in ports.values(),
              f"kubernetes: Service {s['metadata']['name']} targets a container port ({p['targetPort']})")
if headless:
    check([p["targetPort"] for p in headless[0]["spec"]["ports"]] in (["internal"], [ports.get("internal")]),
          "kubernetes: the headless Service publishes the internal listener")
    check(headless[0]["spec"].get("publishNotReadyAddresses") is True,
          "kubernetes: the headless Service keeps draining replicas (publishNotReadyAddresses)")
pdb = next(d for (k, _), d in kube.items() if k == "PodDisruptionBudget")
check(pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), "kubernetes: the PDB selects the pods")

print(f"container.py: {passed} passed, {len(failures)} failed")
sys.exit(min(len(failures), 100))
