"""``megha simulate`` refuses inputs that would give wrong figures, and runs what it is given."""

from __future__ import annotations

import pytest

from megha_cli.main import main


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--limit-jobs", "0"),
        ("--limit-jobs", "-3"),
        ("--time-scale", "-1"),
        ("--time-scale", "0"),
        ("--time-scale", "nan"),
        ("--duration-scale", "-0.5"),
        ("--duration-scale", "inf"),
    ],
)
def test_a_value_out_of_range_is_an_argument_error(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--quiet", f"{option}={value}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err
    assert value in err
