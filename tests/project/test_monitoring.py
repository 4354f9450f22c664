"""deploy/monitoring stays true: promtool checks the rules and runs their tests (each alert fired
by one series set and left quiet by another), the Prometheus configs of compose and Kubernetes
load them, and every metric and label value the rules and the dashboard name is one the service
exports. (A real Prometheus scraping a dev server and a gateway: test_monitoring_scrape.py.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import monitoring_exprs, named_metrics
from prometheus_client import CollectorRegistry

from voicehost.api.errors import ERRORS
from voicehost.metrics import FLUSH_OUTCOMES, JOB_ENDINGS, RTF_BUCKETS, RingMetrics, SpeechMetrics
from voicehost.model import orpheus

pytestmark = pytest.mark.unit

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MONITORING = DEPLOY / "monitoring"
RULE_FILES = ("alerts.yml", "recording.yml")
RULES_TEST = MONITORING / "rules.test.yml"
DASHBOARD = MONITORING / "grafana" / "voicehost.json"
K8S_MONITORING = DEPLOY / "k8s" / "monitoring.yaml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: scripts/system_deps.sh installs it (prometheus)"
)
# The pipeline's own error kinds (voicehost_errors_total{kind}), beside the API's error codes.
PIPELINE_ERROR_KINDS = {"engine", "malformed_frame", "stray_token", "upstream_cut"}


def promtool(*args: str | Path, cwd: Path = MONITORING) -> str:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def rules(name: str) -> list[dict[str, Any]]:
    return [
        r for g in yaml.safe_load((MONITORING / name).read_text())["groups"] for r in g["rules"]
    ]


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules("alerts.yml")}


def exported() -> set[str]:
    """Every series name a worker's and a gateway's registries can export."""
    metrics = SpeechMetrics()
    RingMetrics(metrics.registry, lambda: 0)
    names = set()
    for family in metrics.registry.collect():
        names |= {sample.name for sample in family.samples}
        if family.type == "histogram":
            names |= {f"{family.name}_{end}" for end in ("bucket", "count", "sum")}
        elif family.type == "counter":
            names.add(f"{family.name}_total")
        else:  # a gauge (a labelled one has no sample until a label is set)
            names.add(family.name)
    return names


@needs_promtool
def test_promtool_checks_the_rules():
    out = promtool("check", "rules", *RULE_FILES)
    assert out.count("SUCCESS") == len(RULE_FILES)


@needs_promtool
def test_promtool_runs_the_rule_tests():
    assert "SUCCESS" in promtool("test", "rules", RULES_TEST.name)


def test_every_alert_has_a_case_that_fires_it_and_one_that_stays_quiet():
    """In rules.test.yml each alert is expected to fire for some of its input series and, at
    the same or another time, not for others (an alert's exp_alerts lists all it fires)."""
    doc = yaml.safe_load(RULES_TEST.read_text())
    assert doc["rule_files"] == list(RULE_FILES)
    cases: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for test in doc["tests"]:
        for check in test.get("alert_rule_test", []):
            cases.setdefault(check["alertname"], []).append((test, check))
    assert set(cases) == set(alerts())
    for alert, checks in cases.items():
        fired = [labels["exp_labels"] for _, c in checks for labels in c["exp_alerts"]]
        assert fired, f"{alert}: no case fires it"
        series = {
            frozenset(re.findall(r'(job|instance)="([^"]*)"', s["series"]))
            for test, _ in checks
            for s in test["input_series"]
        }
        fired_keys = {
            frozenset((k, v) for k, v in f.items() if k in ("job", "instance")) for f in fired
        }
        quiet_series = [s for s in series if not any(key <= s for key in fired_keys)]
        quiet_time = any(not c["exp_alerts"] for _, c in checks)
        assert quiet_series or quiet_time, f"{alert}: no case leaves it quiet"


def test_every_alert_says_how_bad_and_what_happened():
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_every_recorded_series_the_alerts_read_is_recorded():
    recorded = {rule["record"] for rule in rules("recording.yml")}
    read = {n for rule in rules("alerts.yml") for n in re.findall(r"\w+:\w+:\w+", rule["expr"])}
    assert read and read <= recorded, read - recorded


def test_every_metric_the_rules_and_dashboard_name_is_exported():
    names = named_metrics(monitoring_exprs())
    assert len(names) > 20
    assert names - {"up"} <= exported(), sorted(names - {"up"} - exported())


def test_every_label_value_they_select_exists():
    """A selector's label value is one the service writes: error kinds are the error table's
    codes (or the pipeline's own), histogram buckets the metric's, job endings and flush
    outcomes the metrics' own label values."""
    known = {
        "kind": set(ERRORS) | PIPELINE_ERROR_KINDS,
        "le": {str(float(b)) for b in RTF_BUCKETS},
        "status": set(JOB_ENDINGS),
        "outcome": set(FLUSH_OUTCOMES),
    }
    selected = [
        (label, value)
        for expr in monitoring_exprs()
        for label, value in re.findall(r'(\w+)="([^"$]*)"', expr)
    ]
    assert {label for label, _ in selected} >= {"kind", "le", "status", "outcome"}
    wrong = [(label, v) for label, v in selected if v not in known.get(label, {v})]
    assert not wrong, wrong


def test_real_time_is_orpheus_tokens_per_second():
    """The stream-speed rule and the dashboard's real-time line use Orpheus' own rate."""
    rate = repr(orpheus.AUDIO_TOKENS_PER_SECOND)
    assert rate == "82.03125"
    assert rate in (MONITORING / "recording.yml").read_text()
    assert rate in DASHBOARD.read_text()


def test_the_dashboard_reads_only_its_prometheus_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource", "job", "instance"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    titles = " ".join(p["title"] for p in panels).lower()
    for wanted in ("time to first audio", "per worker", "per front end", "real time", "lora"):
        assert wanted in titles, wanted
    assert "errors by kind" in titles
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


@needs_promtool
def test_the_compose_prometheus_config_loads_the_rules():
    out = promtool("check", "config", "prometheus.yml")
    assert "2 rule files found" in out
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    prometheus = compose["prometheus"]
    assert "./monitoring:/etc/prometheus/voicehost:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/voicehost/prometheus.yml" in prometheus["command"]
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"voicehost-gateway", "voicehost-worker"}
    targets = {t for job in jobs.values() for c in job["static_configs"] for t in c["targets"]}
    assert targets == {f"{name}:8080" for name in compose if name.startswith(("gateway", "worker"))}
    grafana = " ".join(compose["grafana"]["volumes"])
    assert "./monitoring/grafana/voicehost.json:" in grafana


@needs_promtool
def test_the_k8s_prometheus_holds_the_same_rules_and_its_config_loads_them(tmp_path):
    """The ConfigMap's rule files are deploy/monitoring's, byte for byte; its config passes
    promtool (with its pod discovery swapped for a static target: Debian's Prometheus is built
    without Kubernetes discovery) and names the jobs the rules read."""
    [config_map] = [
        d
        for d in yaml.safe_load_all(K8S_MONITORING.read_text())
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "voicehost-prometheus"
    ]
    data = config_map["data"]
    for name in RULE_FILES:
        assert data[name] == (MONITORING / name).read_text(), f"{name} differs from the ConfigMap's"
        (tmp_path / name).write_text(data[name])
    config = yaml.safe_load(data["prometheus.yml"])
    [job] = config["scrape_configs"]
    relabel = {tuple(r.get("source_labels", [])): r for r in job["relabel_configs"]}
    component = relabel[("__meta_kubernetes_pod_label_app_kubernetes_io_component",)]
    assert (component["target_label"], component["replacement"]) == ("job", "voicehost-$1")
    assert job.pop("kubernetes_sd_configs")[0]["role"] == "pod"
    job["static_configs"] = [{"targets": ["voicehost-worker-0:8080"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    assert "2 rule files found" in promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    mounted = yaml.safe_load_all(K8S_MONITORING.read_text())
    [deployment] = [d for d in mounted if d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert "--config.file=/etc/prometheus/voicehost/prometheus.yml" in container["args"]


def test_the_gateways_ring_metrics_are_its_own():
    """Workers do not export the ring's metrics (a worker saying 0 workers would read as an
    empty ring): only a gateway's registry holds them."""
    worker = {f.name for f in SpeechMetrics().registry.collect()}
    assert not worker & {"voicehost_ring_workers", "voicehost_ring_workers_lost"}
    registry = CollectorRegistry()
    RingMetrics(registry, lambda: 2)
    assert registry.get_sample_value("voicehost_ring_workers") == 2.0
