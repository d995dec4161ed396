"""`linkescape cost` against the seed's figure (3,519,600 yuan with the defaults)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from linkescape.cli import main
from linkescape.tools.cost import CostInputs, compute


def run(*args):
    return CliRunner().invoke(main, ["cost", *args])


def test_defaults_give_the_seed_figure():
    res = run("--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["network_interruptions"] == pytest.approx(419 * 0.084)
    assert d["lost_card_hours"] == pytest.approx(351_960)
    assert d["lost_yuan"] == 3_519_600
    assert d["per_year_yuan"] == pytest.approx(3_519_600 * 365 / 54, abs=0.01)


def test_the_working_is_printed():
    res = run()
    assert res.exit_code == 0, res.output
    for text in ("419 interruptions x 0.084", "= 35.196", "10,000 cards", "351,960", "3,519,600 yuan",
                 "x 365 / 54 days"):
        assert text in res.output, res.output


def test_every_input_is_a_flag():
    d = json.loads(run("--interruptions", "100", "--days", "30", "--network-share", "0.5", "--cards", "2000",
                       "--yuan-per-card-hour", "3", "--recovery-hours", "2", "--json").output)
    assert d["network_interruptions"] == 50
    assert d["lost_card_hours"] == 50 * 2000 * 2
    assert d["lost_yuan"] == 50 * 2000 * 2 * 3
    assert d["per_year_yuan"] == pytest.approx(600_000 * 365 / 30)


@pytest.mark.parametrize("args", [["--network-share", "1.5"], ["--days", "0"], ["--cards", "-1"]])
def test_bad_input_is_refused(args):
    assert run(*args).exit_code == 2


def test_bad_input_is_a_typed_error_in_python():
    from linkescape.errors import UsageError

    with pytest.raises(UsageError):
        compute(CostInputs(network_share=2))
