#!/usr/bin/env python3
"""Checks the Grafana dashboards of deploy/grafana/dashboards (python3 standard library only).

For every dashboard:
  - a fixed, non-empty uid, unique across dashboards, and unique panel ids;
  - every panel other than a row queries Prometheus through the ${datasource} variable and has at
    least one target with a PromQL expression;
  - every $variable an expression uses is defined by the dashboard (or is a Grafana built-in);
  - every metric an expression names is a family that server/engine/metrics.cc builds, or a series that
    deploy/prometheus/rules records (catches typos that stay valid PromQL);
  - every expression parses: each is wrapped in a recording rule of a rule file generated here, with
    the variables replaced by sample values, and `promtool check rules` must accept the file;
  - a `device` variable lists the devices (label_values of opserve_device_memory_bytes, several at
    once, All included), every selector of a device-level series (a family metrics.cc builds in
    DeviceFamilies::Build, or a series a rule records by device) filters device=~"$device", and
    the target's legend names {{device}}: one process serves several GPUs, and a panel that sums
    them or leaves the selection out hides which one is slow, full or out;
  - a copy_bandwidth_gbps variable (the bandwidth the fraction panel divides by) lists a GPU of
    every compute capability in OPSERVE_CUDA_ARCHS' default (CMakeLists.txt), each once with a
    positive value, its options are its query, its current value one of them, and its
    description and the dashboard's name their source (NVIDIA's data sheets).

Usage: check_dashboards.py [--repo DIR] [--keep FILE]
Exit status 0 when all is well, 1 on a finding, 2 when promtool is missing.
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Grafana's built-in interval variables, replaced by a sample duration.
BUILTIN_DURATIONS = {"__rate_interval": "1m", "__interval": "30s", "__range": "1h"}
# Names an expression may use that neither metrics.cc nor the rules define.
EXTRA_METRICS = {"up"}
VAR_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
# A metric name as opserve spells them: its families start with opserve_, recorded series have
# colons. Label names, functions and durations match neither.
METRIC_RE = re.compile(r"(?<![\w:\"])([a-zA-Z_][\w]*:[\w:]+|opserve_\w+)")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
DEVICE_FILTER = 'device=~"$device"'
DEVICE_LEGEND = "{{device}}"


def sample_values(dashboard):
    """The value each template variable stands for in a check: its current value, '.*' for All."""
    values = {}
    for var in dashboard.get("templating", {}).get("list", []):
        current = var.get("current", {}).get("value")
        if isinstance(current, list):
            current = current[0] if current else None
        if current in (None, "", "$__all"):
            current = var.get("allValue") or ".*"
        values[var["name"]] = str(current)
    return values


def substitute(expr, values, problems, where):
    def repl(match):
        name = match.group(1) or match.group(2) or match.group(3)
        if name in BUILTIN_DURATIONS:
            return BUILTIN_DURATIONS[name]
        if name in values:
            return values[name]
        problems.append(f"{where}: undefined variable ${name}")
        return "undefined"

    return VAR_RE.sub(repl, expr)


def known_metrics(repo):
    metrics_cc = open(os.path.join(repo, "server", "engine", "metrics.cc")).read()
    families = set(re.findall(r'\.Name\("(opserve_\w+)"\)', metrics_cc))
    recorded = set()
    for path in glob.glob(os.path.join(repo, "deploy", "prometheus", "rules", "*.yml")):
        recorded |= set(re.findall(r"^\s*-?\s*record:\s*(\S+)\s*$", open(path).read(), re.M))
    if not families or not recorded:
        sys.exit(f"check_dashboards: found no metric families ({len(families)}) or recording "
                 f"rules ({len(recorded)}) under {repo}")
    return families, recorded


def device_metrics(repo):
    """The families that label each series with its device (those DeviceFamilies::Build builds in
    metrics.cc) and the recorded series whose rules keep the device label (sum by (..., device, ...))."""
    metrics_cc = open(os.path.join(repo, "server", "engine", "metrics.cc")).read()
    body = re.search(r"void DeviceFamilies::Build\(.*?\n}\n", metrics_cc, re.S)
    if not body:
        sys.exit("check_dashboards: no DeviceFamilies::Build in server/engine/metrics.cc")
    families = set(re.findall(r'\.Name\("(opserve_\w+)"\)', body.group(0)))
    recorded = set()
    for path in glob.glob(os.path.join(repo, "deploy", "prometheus", "rules", "*.yml")):
        text = open(path).read()
        for name, expr in re.findall(r"^\s*-?\s*record:\s*(\S+)\s*\n\s*expr:\s*\|?\s*\n?((?:.*\n)*?)"
                                     r"(?=\s*-\s*record:|\s*-\s*name:|\s*#|\Z)", text, re.M):
            if re.search(r"\bby\s*\([^)]*\bdevice\b", expr):
                recorded.add(name)
    if not families or not recorded:
        sys.exit(f"check_dashboards: found no device-level families ({len(families)}) or rules "
                 f"({len(recorded)}) under {repo}")
    return families | recorded


def device_selectors(expr, device_level):
    """(metric, selector text or None) for each use of a device-level metric in expr."""
    uses = []
    for match in METRIC_RE.finditer(expr):
        name = match.group(1)
        base = next((name[: -len(s)] for s in HISTOGRAM_SUFFIXES
                     if name.endswith(s) and name[: -len(s)] in device_level), name)
        if base not in device_level:
            continue
        rest = expr[match.end():]
        selector = re.match(r"\{[^}]*\}", rest)
        uses.append((name, selector.group(0) if selector else None))
    return uses


def check_device_variable(dashboard, name, problems):
    var = next((v for v in dashboard.get("templating", {}).get("list", [])
                if v.get("name") == "device"), None)
    if var is None:
        problems.append(f"{name}: no device variable")
        return
    query = var.get("query")
    query = query.get("query") if isinstance(query, dict) else query
    if not re.fullmatch(r"label_values\(opserve_device_memory_bytes(\{[^}]*\})?,\s*device\)",
                        str(query)):
        problems.append(f"{name}: the device variable's query is {query!r}, not "
                        "label_values(opserve_device_memory_bytes, device)")
    if not (var.get("multi") is True and var.get("includeAll") is True):
        problems.append(f"{name}: the device variable must allow several devices and All")


# GPUs of each compute capability that the bandwidth variable may name (docs/DEPLOY.md,
# "Supported GPUs"); an architecture added to OPSERVE_CUDA_ARCHS needs a row here.
ARCH_GPUS = {
    80: ("A100", "A30"),
    86: ("A10", "A40", "RTX A6000"),
    89: ("L4", "L40", "L40S", "RTX 6000 Ada", "RTX 4090"),
    90: ("H100", "H200", "GH200"),
    100: ("B200", "GB200"),
    120: ("RTX 5090", "RTX PRO 6000"),
}


def default_archs(repo):
    """The compute capabilities of OPSERVE_CUDA_ARCHS' default list, as numbers (80, 86, ...)."""
    cmake = open(os.path.join(repo, "CMakeLists.txt")).read()
    m = re.search(r'set\(OPSERVE_CUDA_ARCHS "([^"]*)"', cmake)
    return sorted({int(re.match(r"\d+", a).group()) for a in m.group(1).split(";")}) if m else []


def check_bandwidth_variable(dashboard, name, archs, problems):
    var = next((v for v in dashboard.get("templating", {}).get("list", [])
                if v.get("name") == "copy_bandwidth_gbps"), None)
    if var is None:
        return
    pairs = [tuple(x.strip() for x in item.split(" : ", 1)) for item in var.get("query", "").split(",")]
    options = [(o.get("text"), o.get("value")) for o in var.get("options", [])]
    if pairs != options:
        problems.append(f"{name}: copy_bandwidth_gbps's options are not its query")
    texts = [text for text, _ in pairs]
    if len(set(texts)) != len(texts):
        problems.append(f"{name}: copy_bandwidth_gbps names a GPU twice")
    for text, value in pairs:
        try:
            ok = float(value) > 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            problems.append(f"{name}: copy_bandwidth_gbps {text!r} has no positive value ({value!r})")
    current = var.get("current", {})
    if (current.get("text"), current.get("value")) not in pairs:
        problems.append(f"{name}: copy_bandwidth_gbps's current value is not one of its options")
    if "data sheet" not in var.get("description", "") or "data sheet" not in dashboard.get("description", ""):
        problems.append(f"{name}: copy_bandwidth_gbps's source (the data sheets) is not named in "
                        "its description and the dashboard's")
    if not archs:
        problems.append("CMakeLists.txt: no default OPSERVE_CUDA_ARCHS found")
    for arch in archs:
        gpus = ARCH_GPUS.get(arch)
        if gpus is None:
            problems.append(f"compute capability {arch / 10:.1f} is built (OPSERVE_CUDA_ARCHS) but "
                            "ARCH_GPUS names no GPU of it")
        elif not any(t.split(" (")[0] == g or t.startswith(g + " ") for t in texts for g in gpus):
            problems.append(f"{name}: copy_bandwidth_gbps lists no GPU of compute capability "
                            f"{arch / 10:.1f} ({', '.join(gpus)})")


def metric_known(name, families, recorded):
    if name in recorded or name in families or name in EXTRA_METRICS:
        return True
    return any(name.endswith(s) and name[: -len(s)] in families for s in HISTOGRAM_SUFFIXES)


def walk_panels(panels):
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=os.path.normpath(os.path.join(here, "..", "..")))
    parser.add_argument("--keep", help="also write the generated rule file here")
    args = parser.parse_args()

    promtool = shutil.which("promtool")
    if promtool is None:
        print("check_dashboards: promtool not found (apt-get install prometheus)", file=sys.stderr)
        return 2

    families, recorded = known_metrics(args.repo)
    device_level = device_metrics(args.repo)
    dashboards = sorted(glob.glob(os.path.join(args.repo, "deploy", "grafana", "dashboards", "*.json")))
    if not dashboards:
        print("check_dashboards: no dashboards found", file=sys.stderr)
        return 1

    problems = []
    rules = []
    uids = {}
    for path in dashboards:
        name = os.path.relpath(path, args.repo)
        dashboard = json.load(open(path))
        uid = dashboard.get("uid")
        if not uid:
            problems.append(f"{name}: no fixed uid")
        elif uid in uids:
            problems.append(f"{name}: uid {uid} is also {uids[uid]}'s")
        uids[uid] = name
        values = sample_values(dashboard)
        if "datasource" not in values:
            problems.append(f"{name}: no datasource variable")
        check_device_variable(dashboard, name, problems)
        check_bandwidth_variable(dashboard, name, default_archs(args.repo), problems)
        ids = set()
        for panel in walk_panels(dashboard.get("panels", [])):
            where = f"{name} panel {panel.get('id')} ({panel.get('title')!r})"
            if panel.get("id") in ids:
                problems.append(f"{where}: duplicate panel id")
            ids.add(panel.get("id"))
            if panel.get("type") == "row":
                continue
            if panel.get("datasource", {}).get("uid") != "${datasource}":
                problems.append(f"{where}: datasource is not ${{datasource}}")
            targets = [t for t in panel.get("targets", []) if t.get("expr", "").strip()]
            if not targets:
                problems.append(f"{where}: no PromQL target")
            for target in targets:
                uses = device_selectors(target["expr"], device_level)
                for metric, selector in uses:
                    if selector is None or DEVICE_FILTER not in selector:
                        problems.append(f"{where} target {target.get('refId')}: {metric} is not "
                                        f"filtered by {DEVICE_FILTER}")
                if uses and DEVICE_LEGEND not in target.get("legendFormat", ""):
                    problems.append(f"{where} target {target.get('refId')}: device-level series "
                                    f"with a legend that does not name {DEVICE_LEGEND}")
                expr = substitute(target["expr"], values, problems, where)
                for metric in set(METRIC_RE.findall(expr)):
                    if not metric_known(metric, families, recorded):
                        problems.append(f"{where} target {target.get('refId')}: unknown metric {metric}")
                rules.append({
                    "record": f"dashboard_check:{uid}_panel_{panel.get('id')}_{target.get('refId')}"
                              .replace("-", "_"),
                    "expr": expr,
                })

    # JSON is YAML: promtool reads the generated file as it is.
    rule_file = {"groups": [{"name": "dashboard_promql_check", "rules": rules}]}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dashboard_rules.yml")
        with open(path, "w") as f:
            json.dump(rule_file, f, indent=2)
        if args.keep:
            shutil.copyfile(path, args.keep)
        result = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
        if result.returncode != 0:
            problems.append("promtool check rules rejected the panel expressions:\n"
                            + result.stdout + result.stderr)

    for problem in problems:
        print(f"FAIL {problem}")
    print(f"check_dashboards: {len(dashboards)} dashboard(s), {len(rules)} expression(s), "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
