"""A copy of the local stack with two instances per role, on free ports, for rollouts under load.

The committed local stack has one prefill instance, which no rollout can replace without
dropping requests (the CLI refuses it without ``--allow-downtime``); this copy plans two
prefill instances (2 nodes each) and two decode instances (2 nodes each, DP16/EP16) on the
local inventory's simulated nodes, with a fast simulator.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.local.conftest import BASES, NAMESPACE, ROOT, bindable, plan_addresses

#: The copy's simulator speedup (a rollout test changes it to tell the new version from the old).
SPEEDUP = 40


def set_config(stacks: Path, **sections: dict[str, Any]) -> None:
    """Update ``ascend-deepseek:<section>`` keys of the copy's local stack file."""
    stack_file = stacks / "Pulumi.local.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    for section, values in sections.items():
        doc["config"].setdefault(NAMESPACE + section, {}).update(values)
    stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))


def two_per_role_stacks(tmp_path: Path) -> Path | None:
    """The copy of stacks/ (None when no block of ports is free)."""
    stacks = tmp_path / "stacks"
    shutil.copytree(ROOT / "stacks", stacks)
    set_config(stacks,
               prefill={"instances": 2, "nodes_per_instance": 2, "dp": 2, "tp": 8, "ep": 16},
               decode={"instances": 2, "nodes_per_instance": 2, "dp": 16, "tp": 1, "ep": 16,
                       "max_num_seqs": 8, "max_num_batched_tokens": 8},
               simulator={"speedup": SPEEDUP, "startup_delay_s": 0.2})
    for base in random.sample(BASES, len(BASES)):
        set_config(stacks, ports={"api_base": base, "proxy": base + 10, "balancer_metrics": base + 11,
                                  "dp_rpc_base": base + 20, "kv_base": base + 100})
        if all(bindable(host, port) for host, port in plan_addresses(stacks)):
            return stacks
    return None
