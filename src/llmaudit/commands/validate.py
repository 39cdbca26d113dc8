"""`llmaudit validate synthetic | indicators | capacity`: validations where the truth is known."""

from __future__ import annotations

from pathlib import Path

import typer

from llmaudit.commands.base import (
    validate_app,
)


@validate_app.command("synthetic", context_settings={"allow_extra_args": True})
def validate_synthetic(
    args: list[str] = typer.Argument(None, help="[RECIPE] [key=value ...] (default recipe: synthetic-validation)."),
    out: Path | None = typer.Option(None, "--out", help="Output directory (default ./synthetic-validation)."),
) -> None:
    """The indicator paper's synthetic validation: r_Q ranking vs baseline MIS ranking of 8 simple quantizers."""
    from llmaudit.planning.arguments import split_recipe_args
    from llmaudit.validate.synthetic.outputs import validate_synthetic_command

    recipe, overrides = split_recipe_args(list(args or []))
    validate_synthetic_command(Path(recipe) if recipe else None, overrides, out)


@validate_app.command("indicators", context_settings={"allow_extra_args": True})
def validate_indicators(
    args: list[str] = typer.Argument(
        None, help="[RECIPE] [key=value ...] of the synthetic protocol (default: synthetic-validation)."
    ),
    out: Path = typer.Option(
        Path("llmaudit-out/indicator-validation"), "--out", help="Output directory (indicators.json, indicators.md)."
    ),
    store: list[Path] = typer.Option(
        None,
        "--store",
        help="A reported run directory to validate against its attacks (repeat); default: the real-model recipes' stores that exist.",
    ),
    quick: bool = typer.Option(
        False, "--quick", help="2 data sets x 40 runs: a smoke test, never counts as validation."
    ),
    no_synthetic: bool = typer.Option(False, "--no-synthetic", help="Skip the synthetic protocol (stores only)."),
) -> None:
    """Every candidate attack-free indicator, the published r_Q included, on the synthetic protocol (against
    the baseline MIS) and on run stores (against their attacks), with each one's validation status."""
    from llmaudit.planning.arguments import split_recipe_args
    from llmaudit.validate.candidate_validation import markdown_table, validate_indicators_command

    recipe, overrides = split_recipe_args(list(args or []))
    result = validate_indicators_command(
        out,
        synthetic_recipe=recipe,
        overrides=overrides,
        stores=list(store) if store else None,
        quick=quick,
        synthetic=not no_synthetic,
        log=typer.echo,
    )
    typer.echo(markdown_table(result))
    typer.echo(f"wrote {out / 'indicators.json'} and {out / 'indicators.md'}")


@validate_app.command("capacity")
def validate_capacity(
    out: Path = typer.Option(Path("llmaudit-out/capacity.json"), "--out"),
    seed: int = typer.Option(0),
) -> None:
    """Memorization capacity (bits per parameter) of tiny models on uniformly random tokens (known entropy)."""
    from llmaudit.validate.capacity import capacity_command

    capacity_command(out, seed=seed, markdown_out=out.with_suffix(".md"))
