"""Plan a generated CloudMatrix 384 pool: 16 super pods, 768 servers, 12,288 NPU devices.

Goal: under 3 s and 500 MB. Each repetition runs in a fresh
subprocess so peak RSS belongs to one planning run; the inventory is built as
plain data, validated by the same pydantic models as a file would be, then
planned (validation, placement, memory, invariants, JSON).

Run: python -m benchmarks.plan_scale [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

SUPER_PODS = 16
SERVERS_PER_POD = 48
DEVICES_PER_SERVER = 16


def generated_inventory() -> dict[str, Any]:
    """A CM384 inventory: 16 pods x 48 servers x 16 dies, unique host and device IPs."""
    nodes = []
    for pod in range(SUPER_PODS):
        for server in range(SERVERS_PER_POD):
            index = pod * SERVERS_PER_POD + server
            devices = [
                {
                    "device_id": d,
                    "device_ip": f"10.{100 + pod}.{server}.{d + 1}",
                    "super_device_id": server * DEVICES_PER_SERVER + d,
                    "super_pod_id": pod,
                }
                for d in range(DEVICES_PER_SERVER)
            ]
            nodes.append({"name": f"sp{pod:02d}-srv{server:02d}", "host_ip": f"10.0.{index // 250}.{index % 250 + 1}", "nic": "enp67s0f5", "devices": devices})
    return {"nodes": nodes}


def generated_config() -> dict[str, Any]:
    """Per pod: 16 prefill instances of 1 server and 8 decode instances of 4 servers (48 servers)."""
    ns = "ascend-deepseek:"
    return {
        ns + "hardware": "cm384",
        ns + "inventory": "generated.yaml",
        ns + "prefill": {"instances": 16 * SUPER_PODS, "nodes_per_instance": 1, "dp": 2, "tp": 8, "ep": 16,
                         "max_num_seqs": 16, "max_num_batched_tokens": 16384, "redundant_experts": 16},
        ns + "decode": {"instances": 8 * SUPER_PODS, "nodes_per_instance": 4, "dp": 64, "tp": 1, "ep": 64,
                        "max_num_seqs": 96, "max_num_batched_tokens": 96, "redundant_experts": 64,
                        "context_len": 3072, "gpu_memory_utilization": 0.96},
        ns + "engine": {"vllm_ascend_version": "0.11.0"},
    }


def one_run() -> dict[str, float]:
    """Plan once in this process; seconds and peak RSS in MB."""
    import resource
    import time

    from ascend_runtime.config.loader import parse_inventory, parse_stack_config
    from ascend_runtime.config.stack import Stack
    from ascend_runtime.planner import build_plan

    raw_inventory, raw_config = generated_inventory(), generated_config()
    start = time.perf_counter()
    config, _ = parse_stack_config(raw_config)
    inventory = parse_inventory(raw_inventory)
    stack = Stack(name="cm384-pool", config=config, inventory=inventory, stack_file="generated", inventory_file="generated")
    plan = build_plan(stack)
    text = plan.to_json()
    seconds = time.perf_counter() - start
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert sum(i.npus for i in plan.instances) == SUPER_PODS * SERVERS_PER_POD * DEVICES_PER_SERVER
    return {"seconds": seconds, "peak_rss_mb": rss_mb, "json_mb": len(text) / 1e6, "instances": len(plan.instances)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_run()))
        return
    runs = []
    for _ in range(args.repeats):
        out = subprocess.run([sys.executable, "-m", "benchmarks.plan_scale", "--child"], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout))
    secs = statistics.median(r["seconds"] for r in runs)
    rss = statistics.median(r["peak_rss_mb"] for r in runs)
    from benchmarks.report import machine_line, write_section

    table = (
        "## Planner scale\n\n"
        "Command: `python -m benchmarks.plan_scale --repeats {n}`\n\n"
        "Generated CM384 pool: {pods} super pods, {servers} servers, {devices} NPU devices; "
        "{inst} instances (16 prefill DP2/TP8/EP16 and 8 decode DP64/EP64 per pod). "
        "Each run in a fresh process: parse + validate the config and inventory, plan, serialise to JSON.\n\n"
        "| metric | median of {n} | goal |\n|---|---|---|\n"
        "| time (s) | {secs:.2f} | < 3 |\n| peak RSS of the process (MB, includes the interpreter and imports) | {rss:.0f} | < 500 |\n"
        "| Plan JSON size (MB) | {json:.1f} | |\n\n{machine}\n"
    ).format(n=args.repeats, pods=SUPER_PODS, servers=SUPER_PODS * SERVERS_PER_POD,
             devices=SUPER_PODS * SERVERS_PER_POD * DEVICES_PER_SERVER, inst=runs[0]["instances"],
             secs=secs, rss=rss, json=runs[0]["json_mb"], machine=machine_line())
    write_section("plan_scale", table)
    print(table)


if __name__ == "__main__":
    main()
