import sys
from pathlib import Path
from typing import Optional
import typer
app = typer.Typer()
@app.command()
def state(session: str, at: Optional[int] = typer.Option(None, "--at"), as_json: bool = typer.Option(False, "--json"), store: Optional[str] = typer.Option(None, "--store"), config: Optional[Path] = typer.Option(None, "--config")):
    print(session, at)
@app.command()
def other(x: int = 1): pass
app()
