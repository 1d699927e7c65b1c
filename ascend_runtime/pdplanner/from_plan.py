"""The planner's pool, SLOs and starting counts from a stack's Plan."""

from __future__ import annotations

from ascend_runtime.pdplanner.decide import GroupPool, PlannerConfig, Pool, Slo, StagePool
from ascend_runtime.perf.from_plan import stage_shape
from ascend_runtime.planner.plan import Plan


def stage_pool(plan: Plan, role: str) -> StagePool:
    """Shape of the Plan's first ``role`` instance and the whole nodes one instance takes."""
    return StagePool(stage_shape(plan, role), int(plan.config[role]["nodes_per_instance"]))


def pool_from_plan(plan: Plan) -> Pool:
    """Every node of the stack's inventory, with the Plan's prefill and decode instance shapes."""
    return Pool(len(plan.nodes), stage_pool(plan, "prefill"), stage_pool(plan, "decode"))


def slo_from_plan(plan: Plan) -> Slo:
    """The stack's ``slo`` (milliseconds) in seconds."""
    slo = plan.config["slo"]
    return Slo(float(slo["ttft_ms"]) / 1000.0, float(slo["tpot_ms"]) / 1000.0)


def counts_from_plan(plan: Plan) -> tuple[int, int]:
    """(prefill, decode) instances the Plan deploys."""
    return len(plan.by_role("prefill")), len(plan.by_role("decode"))


def group_pool_from_plan(plan: Plan) -> GroupPool | None:
    """The flexible pool of a ``pd_ratio: auto`` stack (None for a fixed split)."""
    if not plan.flex_groups:
        return None
    g = plan.flex_groups[0]
    flex = {n for grp in plan.flex_groups for n in (*grp.prefill, *grp.decode)}
    fixed = lambda role: sum(1 for i in plan.by_role(role) if i.name not in flex)  # noqa: E731
    pd = plan.config["pd_ratio"]
    return GroupPool(stage_pool(plan, "prefill"), stage_pool(plan, "decode"), fixed("prefill"), fixed("decode"),
                     len(plan.flex_groups), len(g.prefill), len(g.decode), int(pd["min_prefill"]), int(pd["min_decode"]))


def planner_config_from_plan(plan: Plan) -> PlannerConfig:
    """The decision knobs the stack's ``pd_ratio`` sets."""
    pd = plan.config.get("pd_ratio") or {}
    return PlannerConfig(margin=float(pd.get("margin", 0.15)), k_intervals=int(pd.get("k_intervals", 3)),
                         max_changes_per_hour=int(pd.get("max_changes_per_hour", 4)))


def plan_from_json(text: str) -> Plan:
    """A Plan from its ``Plan.to_json`` (derived fields such as ``api_url`` are dropped); ValueError when malformed.

    In a cluster the planner reads the Plan from its ConfigMap (render/objects/pdplanner.py): the image
    carries no stack files.
    """
    import json  # noqa: PLC0415

    try:
        doc = json.loads(text)
    except RecursionError:
        raise ValueError("not a Plan JSON document: nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"not a Plan JSON document: {exc}") from None
    return plan_from_doc(doc)


def plan_from_doc(doc: object) -> Plan:
    """A Plan from the decoded ``Plan.to_json``; ValueError naming the first wrong field (``instances[0].dp``).

    Every field has its declared type (a whole number is no text, ``true`` no count), and ``config`` is a
    stack configuration as the loader validates it (key paths start with ``config.``): the planner reads
    its stages, SLOs and ``pd_ratio`` from there."""
    import dataclasses  # noqa: PLC0415
    import types  # noqa: PLC0415
    import typing  # noqa: PLC0415

    from pydantic import ValidationError  # noqa: PLC0415

    from ascend_runtime.config.loader import problems_from_validation  # noqa: PLC0415
    from ascend_runtime.config.stack import StackConfig  # noqa: PLC0415
    from ascend_runtime.config.inventory import Inventory  # noqa: PLC0415
    from ascend_runtime.planner import plan as plan_module  # noqa: PLC0415

    leaf_names = {int: "a whole number", float: "a number", str: "text", bool: "true or false"}

    def build(cls, data, at):  # type: ignore[no-untyped-def]
        if not isinstance(data, dict):
            raise ValueError(f"{at or 'the document'}: must be a JSON object (got {type(data).__name__})")
        # the Plan's annotations name Inventory only for type checkers (planner/plan.py): resolve it here too
        hints = typing.get_type_hints(cls, {**vars(plan_module), "Inventory": Inventory})
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            kwargs[f.name] = convert(hints[f.name], data[f.name], f"{at}.{f.name}" if at else f.name)
        try:
            return cls(**kwargs)
        except TypeError:
            missing = [f.name for f in dataclasses.fields(cls) if f.name not in data
                       and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
            raise ValueError(f"{at or 'the document'}: missing {', '.join(missing[:5]) or 'fields'}") from None

    def convert(tp, value, at):  # type: ignore[no-untyped-def]
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if dataclasses.is_dataclass(tp):
            return build(tp, value, at)
        if origin is tuple:
            if not isinstance(value, list):
                raise ValueError(f"{at}: must be a JSON list (got {type(value).__name__})")
            return tuple(convert(args[0], v, f"{at}[{k}]") for k, v in enumerate(value))
        if origin in (typing.Union, types.UnionType):
            real = [a for a in args if a is not type(None)]
            return None if value is None else convert(real[0], value, at)
        if tp in leaf_names:
            ok = isinstance(value, tp) and not (tp is int and isinstance(value, bool))
            ok = ok or (tp is float and isinstance(value, int) and not isinstance(value, bool))
            if not ok:
                raise ValueError(f"{at}: must be {leaf_names[tp]} (got {json_type(value)})")
        elif origin is dict and not isinstance(value, dict):
            raise ValueError(f"{at}: must be a JSON object (got {json_type(value)})")
        return value

    def json_type(value: object) -> str:
        return {dict: "an object", list: "a list", str: "text", bool: "a boolean", type(None): "null"}.get(
            type(value), "a number")

    try:
        plan = build(Plan, doc, "")
    except RecursionError:
        raise ValueError("not a Plan JSON document: nested too deeply") from None
    try:
        StackConfig.model_validate(plan.config)
    except ValidationError as exc:
        problems = problems_from_validation(exc, StackConfig, prefix="config.")
        raise ValueError(str(problems[0]) if problems else f"config: {exc.error_count()} invalid values") from None
    if isinstance(plan.config, dict) and "serving" not in plan.config:
        # Plan.to_json leaves the default ``serving: instance`` out of the config: put it back
        plan = dataclasses.replace(plan, config={**plan.config, "serving": "instance"})
    return plan
