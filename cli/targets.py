"""`npuc targets`: the targets, their chips and number formats, and what works today."""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer) -> None:
    @app.command("targets")
    def targets(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
        """List the targets npuc knows, their chips, number formats and status.

        Example: npuc targets --json
        """
        from npuc.compiler.targets import all_targets

        rows = [
            {
                "target": t.name,
                "chips": list(t.chips),
                "formats": list(t.number_formats),
                "artifact": t.artifact,
                "builds": t.build is not None,
                "status": t.status,
            }
            for t in all_targets()
        ]
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
            return
        for row in rows:
            typer.echo(f"{row['target']:<8} chips: {', '.join(row['chips'])}")
            typer.echo(f"{'':<8} formats: {', '.join(row['formats'])}")
            typer.echo(f"{'':<8} artifact: {row['artifact']}")
            typer.echo(f"{'':<8} build: {'yes' if row['builds'] else 'not yet'} — {row['status']}")
