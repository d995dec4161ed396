"""``linkescape cost``: what network interruptions cost a training run, the seed's calculation.

The defaults reproduce it: Llama 3 405B saw 419 unexpected interruptions in
54 days of pre-training, about 8.4 % of them caused by the network; an H100
costs about 10 yuan per card-hour; if every interruption takes one hour to
recover from, a 10,000-card cluster loses about 3.5 million yuan per run:

    419 x 0.084 = 35.196 network interruptions
    35.196 x 10,000 cards x 1 h = 351,960 card-hours
    351,960 x 10 yuan = 3,519,600 yuan

``per_year_yuan`` scales the run to 365 days at the same rate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List

from ..errors import UsageError


@dataclass(frozen=True)
class CostInputs:
    interruptions: float = 419
    days: float = 54
    network_share: float = 0.084
    cards: float = 10000
    yuan_per_card_hour: float = 10
    recovery_hours: float = 1

    def __post_init__(self) -> None:
        for name in ("interruptions", "cards", "yuan_per_card_hour", "recovery_hours"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name.replace('_', '-')} must not be negative")
        if self.days <= 0:
            raise UsageError("days must be positive")
        if not 0 <= self.network_share <= 1:
            raise UsageError("network-share must be in [0, 1]")


def compute(inp: CostInputs) -> Dict[str, Any]:
    network = inp.interruptions * inp.network_share
    card_hours = network * inp.cards * inp.recovery_hours
    yuan = card_hours * inp.yuan_per_card_hour
    per_year = yuan * 365.0 / inp.days
    return {
        "inputs": asdict(inp),
        "network_interruptions": round(network, 6),
        "lost_card_hours": round(card_hours, 6),
        "lost_yuan": round(yuan, 2),
        "per_year_yuan": round(per_year, 2),
    }


def _n(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.6g}" if abs(v) < 1000 else f"{v:,.2f}"


def working(res: Dict[str, Any]) -> str:
    i = res["inputs"]
    lines: List[str] = [
        f"network interruptions = {_n(i['interruptions'])} interruptions x {i['network_share']:g} network share"
        f" = {_n(res['network_interruptions'])}",
        f"lost card-hours       = {_n(res['network_interruptions'])} x {_n(i['cards'])} cards x "
        f"{_n(i['recovery_hours'])} h recovery = {_n(res['lost_card_hours'])}",
        f"lost per run          = {_n(res['lost_card_hours'])} card-hours x {_n(i['yuan_per_card_hour'])} yuan"
        f" = {_n(res['lost_yuan'])} yuan (a {_n(i['days'])}-day run)",
        f"per year              = {_n(res['lost_yuan'])} yuan x 365 / {_n(i['days'])} days = "
        f"{_n(res['per_year_yuan'])} yuan",
        "",
        f"Network interruptions cost {_n(res['lost_yuan'])} yuan per run and {_n(res['per_year_yuan'])} yuan per year;",
        "Escaping a failed NIC, cable or optic keeps the job running: this is what it can save.",
    ]
    return "\n".join(lines) + "\n"


__all__ = ["CostInputs", "compute", "working"]
