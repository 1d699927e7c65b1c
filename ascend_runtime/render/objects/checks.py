"""The post-deploy check Job: smoke, then a short throughput check, through the proxy.

Pulumi waits for a Job to complete; a failed Job fails ``pulumi up``.
"""

from __future__ import annotations

import shlex
from typing import Any

from ascend_runtime.render.objects.common import (
    CHECKS_JOB_NAME,
    LABEL_COMPONENT,
    Context,
    K8sObject,
    digest,
    metadata,
    pod_security,
    tmp_volume,
)

COMPONENT = "checks"


def check_script(ctx: Context) -> str:
    """The shell script the Job runs (``set -e``: the first failing check fails the Job)."""
    plan, tc, slo = ctx.plan, ctx.plan.config["throughput_check"], ctx.plan.config["slo"]
    endpoint = plan.proxy_url
    decode_npus = sum(i.npus for i in plan.by_role("decode"))
    smoke = ["ascend-deploy", "check", "smoke", "--endpoint", endpoint]
    # every instance the proxy routes to: their health, and that each PD pair moved KV (checks/kv_handover.py)
    for inst in plan.endpoints():
        smoke += ["--instance", f"{inst['name']}:{inst['role']}={inst['url']}"]
    tput = ["ascend-deploy", "check", "throughput", "--endpoint", endpoint,
            "--input-len", str(tc["input_len"]), "--output-len", str(tc["output_len"]),
            "--concurrency", str(tc["concurrency"]), "--num-prompts", str(tc["num_prompts"]),
            "--slo-ttft-ms", f"{slo['ttft_ms']:g}", "--slo-tpot-ms", f"{slo['tpot_ms']:g}",
            "--npus", str(decode_npus), "--no-progress"]
    if tc["min_goodput"] > 0:
        tput += ["--min-goodput", f"{tc['min_goodput']:g}"]
    return "set -eu\n" + shlex.join(smoke) + "\n" + shlex.join(tput) + "\n"


def checks_job(ctx: Context) -> K8sObject | None:
    """The Job (None when the stack turns post-deploy checks off)."""
    if not ctx.k8s["post_deploy_checks"]:
        return None
    timeout = ctx.k8s["checks_timeout_seconds"]
    labels = {LABEL_COMPONENT: COMPONENT, "app.kubernetes.io/name": CHECKS_JOB_NAME}
    tmp, tmp_mount = tmp_volume()
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # talks to the proxy only
        "containers": [{
            "name": "checks",
            "image": ctx.runtime_image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c", check_script(ctx)],
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
            "securityContext": pod_security(),
            "volumeMounts": [tmp_mount],
        }],
        "volumes": [tmp],
    }
    if ctx.image_pull_secrets:
        pod_spec["imagePullSecrets"] = ctx.image_pull_secrets
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(ctx, CHECKS_JOB_NAME, COMPONENT, labels, annotations={
            "pulumi.com/skipAwait": "false",
            "pulumi.com/timeoutSeconds": str(timeout + 120),
        }),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": timeout,
            "template": {
                # a changed Plan changes the template, so Pulumi replaces the Job and the checks run again
                "metadata": {"labels": metadata(ctx, CHECKS_JOB_NAME, COMPONENT, labels)["labels"],
                             "annotations": {"ascend-deepseek/plan-digest": digest(ctx.plan.to_dict())[:16]}},
                "spec": pod_spec,
            },
        },
    }
