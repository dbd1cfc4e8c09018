"""Federation config: defaults, validation, and the one process plan."""

from __future__ import annotations

import pytest

from common.config import FederationConfig, parse_config, process_plan
from common.errors import ConfigError


def test_defaults_need_no_file() -> None:
    cfg = parse_config({}, env={})
    assert (cfg.gms, cfg.lms, cfg.nodes_per_lm) == (3, 3, 40)
    assert cfg.broker_url == "amqp://guest:guest@127.0.0.1:5672/"
    assert [u.gm for u in cfg.user_configs] == ["gm0", "gm1", "gm2"]
    assert sum(len(c.nodes) for c in cfg.clusters) == 120


def test_broker_url_from_the_environment() -> None:
    cfg = parse_config({}, env={"MEGHA_BROKER_URL": "amqps://u:p@broker:5671/"})
    assert cfg.broker_url == "amqps://u:p@broker:5671/"
    # a broker on another host, in clear, only with tls off (issue 32 item 10)
    cfg = parse_config({"tls": "off"}, env={"MEGHA_BROKER_URL": "amqp://u:p@broker:5672/"})
    assert cfg.broker_url == "amqp://u:p@broker:5672/"


@pytest.mark.parametrize(
    "table",
    [
        {"gms": "three"},
        {"no_such_key": 1},
        {"gms": 0},
        {"heartbeat_s": 5.0, "worker_timeout_s": 1.0},
        {"users": "alice:0.9@gm7"},
        {"profile": "quantum"},
        {"nodes_per_lm": 2, "gms": 3},
        {"max_user_tasks": -1},
        {"srpt_half_life_s": 0.0},
        {"srpt_half_life_s": float("nan")},
    ],
)
def test_bad_config_is_a_clear_error(table: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        parse_config({"federation": table}, env={})


def test_process_plan_has_one_gunicorn_process_per_component() -> None:
    cfg = FederationConfig(gms=2, lms=3, nodes_per_lm=4)
    plan = process_plan(cfg, "f.toml")
    assert [p.name for p in plan] == [
        "lm0-workers", "lm1-workers", "lm2-workers", "lm0", "lm1", "lm2", "gm0", "gm1",
    ]  # fmt: skip
    ports = [p.port for p in plan]
    assert len(set(ports)) == len(ports)
    for p in plan:
        assert p.argv[:3] == ["python3", "-m", "gunicorn"]
        assert p.argv[p.argv.index("--workers") + 1] == "1"
        assert p.env["MEGHA_CONFIG"] == "f.toml"
        assert p.env["MEGHA_ID"] in (p.name, p.name.removesuffix("-workers"))


def test_toml_round_trip(tmp_path: object) -> None:
    import tomllib

    cfg = FederationConfig(gms=2, users="a:0.5@gm0,b:0.5@gm1", constraints=True)
    again = parse_config(tomllib.loads(cfg.to_toml()), env={})
    assert again == cfg


def test_srpt_half_life_is_a_federation_key_and_inf_means_no_aging() -> None:
    assert parse_config({}, env={}).srpt_half_life_s == 60.0
    cfg = parse_config({"federation": {"srpt_half_life_s": 300.0}}, env={})
    assert cfg.srpt_half_life_s == 300.0
    assert parse_config(
        {"federation": {"srpt_half_life_s": float("inf")}}, env={}
    ).srpt_half_life_s == float("inf")
