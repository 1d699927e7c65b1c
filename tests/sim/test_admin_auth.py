"""The simulator's /admin API is bearer-token guarded, like the proxy's, and closed without a token."""

from __future__ import annotations

import os

import aiohttp
import pytest

from ascend_runtime.cli import build_parser
from ascend_runtime.cli.commands.sim import config_from_args
from ascend_runtime.perf.sim_config import SimConfig
from ascend_runtime.perf.sim_flags import argv_from_config
from ascend_runtime.sim.server import build_app

ADMIN_TOKEN = "admin-auth-test-token"

TOKEN_ENV = "SIM_TEST_ADMIN_TOKEN"


def admin_routes(handle) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """(method, path) of every /admin route the simulator's application has."""
    app = build_app(handle.state)
    out = sorted({(r.method, r.resource.canonical) for r in app.router.routes()
                  if r.resource is not None and r.resource.canonical.startswith("/admin") and r.method != "HEAD"})
    assert len(out) >= 6, out  # expert_load, expert_map GET/POST, faults GET/POST, stats
    return out


async def _call(session: aiohttp.ClientSession, url: str, method: str, path: str,
                headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
    body = None
    if method == "POST":
        if path == "/admin/expert_map":
            async with session.get(url + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as r:
                body = await r.json() if r.status == 200 else {}
        else:
            body = {}
    params = {"since": "0"} if path == "/admin/expert_load" else None
    async with session.request(method, url + path, json=body, params=params, headers=headers or {}) as resp:
        await resp.read()
        return resp


async def test_every_admin_route_needs_the_bearer_token(sim) -> None:  # type: ignore[no-untyped-def]
    h = await sim(admin_token=ADMIN_TOKEN)
    async with aiohttp.ClientSession() as plain:
        for method, path in admin_routes(h):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_TOKEN},
                            {"Authorization": f"Basic {ADMIN_TOKEN}"}):
                resp = await _call(plain, h.url, method, path, headers)
                assert resp.status == 401, (method, path, headers, resp.status)
                assert resp.headers["WWW-Authenticate"] == "Bearer"
            resp = await _call(plain, h.url, method, path, {"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert resp.status == 200, (method, path, resp.status)


async def test_without_a_token_the_admin_api_is_closed(sim) -> None:  # type: ignore[no-untyped-def]
    h = await sim(admin_token=None)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as session:
        for method, path in admin_routes(h):
            resp = await _call(session, h.url, method, path)
            assert resp.status == 403, (method, path, resp.status)
        # an unknown /admin path is refused too, before routing
        async with session.get(f"{h.url}/admin/anything-else") as resp:
            assert resp.status == 403
        # the admin settings were not touched
        assert h.state.faults.as_dict()["error_rate"] == 0.0


async def test_serving_routes_stay_open(sim) -> None:  # type: ignore[no-untyped-def]
    h = await sim(admin_token=ADMIN_TOKEN)
    async with aiohttp.ClientSession() as plain:
        for path in ("/health", "/metrics", "/v1/models"):
            async with plain.get(h.url + path) as resp:
                assert resp.status == 200, path
        async with plain.post(f"{h.url}/v1/completions", json={"prompt": "a b", "max_tokens": 2}) as resp:
            assert resp.status == 200


def test_cli_reads_the_token_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["sim", "--role", "decode", "--instance", "d", "--port", "1", "--kv-port", "2"]
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert config_from_args(build_parser().parse_args(base)).admin_token is None
    with pytest.raises(ValueError, match=TOKEN_ENV):
        config_from_args(build_parser().parse_args([*base, "--admin-token-env", TOKEN_ENV]))
    monkeypatch.setenv(TOKEN_ENV, "")
    with pytest.raises(ValueError, match=TOKEN_ENV):
        config_from_args(build_parser().parse_args([*base, "--admin-token-env", TOKEN_ENV]))
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    cfg = config_from_args(build_parser().parse_args([*base, "--admin-token-env", TOKEN_ENV]))
    assert cfg.admin_token == "from-env"
    stacked = config_from_args(build_parser().parse_args(
        ["sim", "--stack", "local", "--instance", "decode-1", "--admin-token-env", TOKEN_ENV]))
    assert stacked.admin_token == "from-env"
    # the token never travels in argv or in the config's repr
    assert "from-env" not in argv_from_config(cfg) and "from-env" not in repr(cfg)
    assert os.environ[TOKEN_ENV] == "from-env"


def test_config_default_has_no_token() -> None:
    assert SimConfig(role="decode", instance="x").admin_token is None


async def test_the_balancer_sends_the_token_it_is_given(sim) -> None:  # type: ignore[no-untyped-def]
    """`balance serve --sim-token-env VAR`: load polling and map applying carry the simulators' token."""
    from ascend_runtime.balancer.apply import SimulatorApplier
    from ascend_runtime.balancer.sources import HttpLoadSource
    from ascend_runtime.cli.commands.balance import _WithSimToken

    h = await sim(admin_token=ADMIN_TOKEN, npus=32, dp=32, tp=1, ep=32, redundant_experts=32)
    async with aiohttp.ClientSession() as plain:
        with pytest.raises(aiohttp.ClientResponseError) as refused:
            await HttpLoadSource("d", h.url).collect(plain)
        assert refused.value.status == 401
        source = _WithSimToken(HttpLoadSource("d", h.url), ADMIN_TOKEN)
        assert source.name == "d"
        await source.collect(plain)  # no error: authorised
        async with plain.get(f"{h.url}/admin/expert_map", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as r:
            current = await r.json()
        assert not (await SimulatorApplier("d", h.url).apply(plain, current)).ok
        result = await _WithSimToken(SimulatorApplier("d", h.url), ADMIN_TOKEN).apply(plain, current)
        assert result.ok, result.detail


def test_balancer_refuses_an_unset_token_variable(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    args = build_parser().parse_args(["balance", "serve", "--ranks", "32", "--slots", "9", "--instance", "d=http://127.0.0.1:1",
                                      "--dry-run", "--sim-token-env", TOKEN_ENV])
    assert args.func(args) == 2
    assert TOKEN_ENV in capsys.readouterr().err
