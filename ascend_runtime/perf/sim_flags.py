"""The simulator's command-line form: which :class:`SimConfig` fields are flags, and the argv for a config.

The CLI (``ascend-deploy sim``) parses these flags; the renderer builds the
kind target's simulator argv from a config. The mapping lives here, beside the
config it describes, so that neither the renderer nor the performance model
imports the simulator.
"""

from __future__ import annotations

from ascend_runtime.perf.sim_config import SimConfig

#: SimConfig fields written as ``--<field with dashes>`` flags, in argv order.
FLAG_FIELDS = (
    "role", "instance", "host", "port", "kv_port", "kv_host", "hardware", "npus", "dp", "tp", "ep", "nodes",
    "max_num_seqs", "max_num_batched_tokens", "redundant_experts", "mtp", "speedup", "startup_delay", "link_gbps",
    "kv_timeout_s", "kv_wire_scale", "seed", "model", "expert_map", "block_size", "enable_prefix_caching",
    "rank_endpoints",
)
#: Switches that default to on: written as ``--no-<flag>`` when off (argparse.BooleanOptionalAction).
ON_BY_DEFAULT = frozenset({"enable_prefix_caching"})


def argv_from_config(cfg: SimConfig) -> list[str]:
    """`ascend-deploy sim` arguments that reproduce ``cfg`` (the inverse of the CLI's ``config_from_args``):
    flag and value strings in :data:`FLAG_FIELDS` order, floats as ``repr``, ``None`` fields left out.

    The admin token is never an argument: callers add ``--admin-token-env VAR`` and set ``VAR``.
    """
    argv: list[str] = []
    for name in FLAG_FIELDS:
        value = getattr(cfg, name)
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if name in ON_BY_DEFAULT:
                argv += [] if value else ["--no-" + flag[2:]]
            else:
                argv += [flag] if value else []
        elif isinstance(value, tuple):  # --rank-endpoints host:port,host:port,... (left out when empty)
            argv += [flag, ",".join(value)] if value else []
        elif value is not None:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv
