"""The prices file (policies/prices.yaml): what one GPU-hour of each GPU model costs, for `gpushare showback`.

Reviewed in Git like the guardrails; per-environment overrides replace single models' prices. No file means
GPU-hours only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from gpushare.core.catalog import load_catalog
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.loading import Located, Strict, load_model
from gpushare.core.paths import project_root

# Finite and below a million per GPU-hour (list prices are single digits): `.inf` would print as Infinity, which
# is not JSON.
Price = Annotated[float, Field(ge=0, lt=1_000_000, allow_inf_nan=False,
                               description="Price of one GPU-hour of this model, in the file's currency.")]


class EnvironmentPrices(Strict):
    hourly: dict[str, Price] = Field(description="GPU model (catalog name or alias) -> price per GPU-hour.")


class Prices(Strict):
    currency: str = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code, e.g. EUR or USD.")
    hourly: dict[str, Price] = Field(description="GPU model (catalog name or alias) -> price per GPU-hour.")
    environments: dict[str, EnvironmentPrices] = Field(
        default_factory=dict, description="Per-environment overrides of single models' prices.")


class PriceTable:
    """Prices keyed by the catalog's model name, for one environment."""

    def __init__(self, currency: str, hourly: dict[str, float], source: Path) -> None:
        self.currency = currency
        self.hourly = hourly
        self.source = source

    def price(self, model: str) -> float:
        try:
            return self.hourly[model]
        except KeyError:
            raise GpushareError(Problem(f"no price for GPU model {model!r}", file=str(self.source), path="hourly",
                                        fix=f"add `{model}: <price per GPU-hour>` under hourly")) from None


def prices_path() -> Path:
    return project_root() / "policies" / "prices.yaml"


def _canonical(doc: Located, hourly: dict[str, float], base: tuple[str, ...]) -> dict[str, float]:
    catalog = load_catalog()
    out: dict[str, float] = {}
    named: dict[str, str] = {}  # model -> the name it was priced under
    for name, price in hourly.items():
        model = catalog.find(name)
        if model is None:
            raise GpushareError(doc.problem((*base, name), f"{name!r} is not a GPU model in the catalog",
                                            fix="use the model's NVML name, e.g. NVIDIA H100 80GB HBM3"))
        if model.name in named:  # two of a model's names: one price would win silently
            raise GpushareError(doc.problem((*base, name), f"{name!r} and {named[model.name]!r} are both "
                                            f"{model.name}, priced twice", fix="keep one price for the model, "
                                            "under either name (`gpushare gpus` lists each model's names)"))
        named[model.name] = name
        out[model.name] = price
    return out


def load_prices(path: Path, environment: str) -> PriceTable:
    """The prices that apply to `environment`; errors name the file, the key and the fix."""
    prices, doc = load_model(path, Prices, "Prices", "prices file", "policies/prices.example.yaml")
    hourly = _canonical(doc, prices.hourly, ("hourly",))
    override = prices.environments.get(environment)
    if override is not None:
        hourly |= _canonical(doc, override.hourly, ("environments", environment, "hourly"))
    return PriceTable(prices.currency, hourly, path)
